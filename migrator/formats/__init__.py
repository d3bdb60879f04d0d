"""The file formats, one codec each: burnpack (and its CBOR), SafeTensors, PyTorch (and the
restricted pickle it needs); which format a file is in."""

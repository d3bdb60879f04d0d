"""The file formats, one codec each: burnpack (and its CBOR), SafeTensors, PyTorch (and the restricted
pickle it needs, and its writer), GGUF, PyTorch Distributed Checkpoint folders, Megatron Core torch_dist
folders, DeepSpeed ZeRO folders, Hugging Face Trainer checkpoint folders, Megatron-LM legacy
checkpoint folders and NeMo 2 checkpoint folders (read only); which format a file is in (`detect`).

Each format declares itself once, a `FormatSpec` in `specs/<name>.py`; `registry` holds them and
derives every list of formats and every question asked of one (see docs/development.md, "Adding a
format")."""

from .registry import choices, is_format, names, register, spec, specs, target_format

__all__ = ["choices", "is_format", "names", "register", "spec", "specs", "target_format"]

"""Which format a file is in: magic bytes first, extension second."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from ..core.bytesource import ByteSource
from ..core.errors import UnknownFormatError

FORMATS = ("burnpack", "safetensors", "pytorch", "gguf")

BURNPACK_MAGIC = b"NRUB"
GGUF_MAGIC = b"GGUF"
PYTORCH_LEGACY_MAGIC = bytes.fromhex("80028a0a6cfc9c46f9206aa850192e")
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")

EXTENSIONS = {
    ".bpk": "burnpack",
    ".burnpack": "burnpack",
    ".safetensors": "safetensors",
    ".st": "safetensors",
    ".pt": "pytorch",
    ".pth": "pytorch",
    ".bin": "pytorch",
    ".ckpt": "pytorch",
    ".tar": "pytorch",
    ".gguf": "gguf",
}


def from_magic(source: ByteSource) -> str | None:
    head = source.read(0, min(source.size, 512), "format detection")
    if head[:4] == BURNPACK_MAGIC:
        return "burnpack"
    if head[:4] == GGUF_MAGIC:
        return "gguf"
    if head[:4] in ZIP_MAGICS or head.startswith(PYTORCH_LEGACY_MAGIC):
        return "pytorch"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "pytorch"
    if len(head) >= 9:
        (n,) = struct.unpack("<Q", head[:8])
        if head[8:9] in (b"{", b" ", b"\t", b"\n", b"\r") and 2 <= n <= source.size - 8:
            return "safetensors"
    if head[:1] == b"\x80" and len(head) >= 2 and head[1] <= 5:
        return "pytorch"  # a bare pickle: the PyTorch reader gives the precise error
    return None


def from_extension(path: str | os.PathLike[str]) -> str | None:
    return EXTENSIONS.get(Path(path).suffix.lower())


def detect(source: ByteSource, path: str | os.PathLike[str] | None = None) -> str:
    fmt = from_magic(source)
    if fmt is None and path is not None:
        fmt = from_extension(path)
    if fmt is None:
        raise UnknownFormatError(
            "unrecognised format: not burnpack (magic NRUB), SafeTensors (u64 header length + JSON), "
            "PyTorch (zip, tar, legacy pickle) or GGUF (magic GGUF); name the format explicitly if the extension is "
            "unusual",
            file=source.label,
        )
    return fmt


def target_format(path: str | os.PathLike[str], explicit: str = "auto") -> str:
    """Format of an output path: explicit, else by extension, else burnpack (Burn appends `.bpk`)."""
    if explicit != "auto":
        if explicit not in FORMATS:
            raise UnknownFormatError(f"unknown format '{explicit}' (use one of {', '.join(FORMATS)})")
        return explicit
    suffix = os.path.splitext(os.path.basename(os.fspath(path)))[1]
    if suffix == "":
        return "burnpack"
    fmt = from_extension(path)
    if fmt is None:
        raise UnknownFormatError(
            f"cannot tell the output format from extension '{suffix}'; use .bpk, .safetensors, .pt or .gguf, "
            "or name the format", file=os.fspath(path))
    return fmt

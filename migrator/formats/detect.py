"""Which format a file is in: the registered formats' sniffs of its first bytes first, its extension
second (`formats.registry`)."""

from __future__ import annotations

import os

from ..core.bytesource import ByteSource
from ..core.errors import UnknownFormatError
from .registry import by_extension, listed, specs, target_format

__all__ = ["detect", "from_extension", "from_magic", "target_format"]

HEAD_BYTES = 512


def from_magic(source: ByteSource) -> str | None:
    """The format whose sniff first recognises the file's head: every format's by rank (a magic number
    before a looser test), then in registry order."""
    head = source.read(0, min(source.size, HEAD_BYTES), "format detection")
    tests = sorted(((sniff.rank, i, s.name, sniff.test) for i, s in enumerate(specs()) if s.reader is not None
                    for sniff in s.sniffs), key=lambda t: t[:2])
    return next((name for _, _, name, test in tests if test(head, source.size)), None)


def from_extension(path: str | os.PathLike[str]) -> str | None:
    return by_extension(path)


def detect(source: ByteSource, path: str | os.PathLike[str] | None = None) -> str:
    fmt = from_magic(source)
    if fmt is None and path is not None:
        fmt = from_extension(path)
    if fmt is None:
        raise UnknownFormatError(f"unrecognised format: not {_recognised()}; name the format explicitly if the "
                                 "extension is unusual", file=source.label)
    return fmt


def _recognised() -> str:
    """`burnpack (magic NRUB), SafeTensors (...) or GGUF (magic GGUF)`: what detection looked for."""
    return listed([f"{s.title} ({s.recognized_by})" for s in specs() if s.sniffs and s.reader is not None])

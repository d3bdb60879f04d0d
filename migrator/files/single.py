"""One file or buffer opened as a reader: the format detected (or given), `top_level_key` selected.

Local files, buffers, remote objects and each shard of a folder all end here.
"""

from __future__ import annotations

import os
from typing import Any

from ..core.bytesource import ByteSource, open_source
from ..core.limits import Limits
from ..formats.base import Reader
from ..formats.detect import detect
from ..formats.registry import reader_class


def open_single(src: str | os.PathLike[str] | bytes | bytearray | memoryview | ByteSource, format: str,
                limits: Limits, options: dict[str, Any]) -> Reader:
    """A local file (a burnpack path resolved as Burn does) or an in-memory buffer as a reader."""
    if isinstance(src, str | os.PathLike) and format in ("auto", "burnpack"):
        from ..formats.burnpack import resolve_read_path

        src = resolve_read_path(src)
    return reader_over(open_source(src), src if isinstance(src, str | os.PathLike) else None, format, limits,
                       options)


def reader_over(source: ByteSource, path: str | os.PathLike[str] | None, format: str, limits: Limits,
                options: dict[str, Any]) -> Reader:
    """The reader of `format` (detected when "auto") over an open `source`, with `top_level_key`
    selected; the source is closed if that fails. Local files and remote objects both come here."""
    try:
        fmt = detect(source, path) if format == "auto" else format
        cls = reader_class(fmt)
        key = options.pop("top_level_key", None) if not cls.nested_keys else None
        if not cls.keeps_structure:  # only a PyTorch checkpoint has containers to keep
            options.pop("keep_structure", None)
        reader = cls(source, limits=limits, **options)  # type: ignore[call-arg]
        if reader.format == "gguf":
            _whole_gguf(reader, path)
        if key is not None:
            reader.select(key)
        return reader
    except BaseException:
        source.close()
        raise


def _whole_gguf(reader: Reader, path: str | os.PathLike[str] | None) -> None:
    """Refuse one file of a split GGUF read alone (renamed, or named out of its set): its own
    split.count says the model's other tensors are in other files, which a single-file read would
    silently leave out."""
    from ..core.errors import FormatError

    count = getattr(reader.metadata.get("split.count"), "data", None)
    if isinstance(count, int) and count > 1:
        no = getattr(reader.metadata.get("split.no"), "data", None)
        part = f"part {no + 1} of {count}" if isinstance(no, int) else f"one of {count} parts"
        raise FormatError(f"this GGUF is {part} of a split model (split.count); name the set's first file "
                          "(NAME-00001-of-NNNNN.gguf) or its folder, so that every part is read",
                          file=None if path is None else os.fspath(path))

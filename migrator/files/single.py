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
from ..formats.registry import AUTO, is_format, spec


def open_single(src: str | os.PathLike[str] | bytes | bytearray | memoryview | ByteSource, format: str,
                limits: Limits, options: dict[str, Any]) -> Reader:
    """A local file (a burnpack path resolved as Burn does) or an in-memory buffer as a reader."""
    if isinstance(src, str | os.PathLike) and (format == AUTO or is_format(format, for_burn=True)):
        from ..formats.burnpack import resolve_read_path  # Burn's rule for an extension-less path

        src = resolve_read_path(src)
    return reader_over(open_source(src), src if isinstance(src, str | os.PathLike) else None, format, limits,
                       options)


def reader_over(source: ByteSource, path: str | os.PathLike[str] | None, format: str, limits: Limits,
                options: dict[str, Any]) -> Reader:
    """The reader of `format` (detected when "auto") over an open `source`, with `top_level_key`
    selected; the source is closed if that fails. Local files and remote objects both come here."""
    try:
        fmt = spec(detect(source, path) if format == AUTO else format)
        cls = fmt.reader_class()
        key = options.pop("top_level_key", None) if not cls.nested_keys else None
        if not cls.keeps_structure:  # only a PyTorch checkpoint has containers to keep
            options.pop("keep_structure", None)
        reader = cls(source, limits=limits, **options)  # type: ignore[call-arg]
        if fmt.after_open is not None:  # e.g. one part of a split GGUF, refused alone
            fmt.after_open(reader, None if path is None else os.fspath(path))
        if key is not None:
            reader.select(key)
        return reader
    except BaseException:
        source.close()
        raise


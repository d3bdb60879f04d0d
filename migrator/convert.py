"""Plain format conversion: every tensor, same names, same bytes, in another container."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import PRODUCER, __version__
from .formats import open_file, save
from .formats.detect import target_format

METADATA_FORMATS = ("burnpack", "safetensors")


def default_metadata(fmt: str) -> dict[str, str]:
    """What Burn's stores write on every save (`format`, `producer`, `version`), with migrator as producer."""
    if fmt not in METADATA_FORMATS:
        return {}
    return {"format": fmt, "producer": PRODUCER, "version": __version__}


@dataclass
class ConvertResult:
    source: str
    source_format: str
    target: str
    target_format: str
    tensors: int
    nbytes: int
    metadata: dict[str, str]
    scalars_written: int
    dropped: list[str] = field(default_factory=list)


def output_metadata(source_format: str, target_fmt: str, source_meta: Mapping[str, str], *,
                    extra: Mapping[str, str] | None, clear: bool) -> dict[str, str]:
    """Same format: the source's metadata untouched (a rewrite stays byte-identical).

    Across formats: the source's entries, then the target's defaults on top, so `format` always
    names the file it is written in. `clear` drops everything; `extra` is added last.
    """
    if clear:
        meta: dict[str, str] = {}
    elif source_format == target_fmt:
        meta = dict(source_meta)
    else:
        meta = {**source_meta, **default_metadata(target_fmt)}
    meta.update(extra or {})
    return meta if target_fmt in METADATA_FORMATS else {}


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    source_format: str = "auto",
    target_format_name: str = "auto",
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    clear_metadata: bool = False,
    reader_options: Mapping[str, Any] | None = None,
) -> ConvertResult:
    """Convert `src` to `dst` atomically, streaming one tensor at a time."""
    fmt = target_format(dst, target_format_name)
    with open_file(src, source_format, **dict(reader_options or {})) as reader:
        meta = output_metadata(reader.format, fmt, reader.metadata, extra=metadata, clear=clear_metadata)
        scalars = reader.scalars if fmt == "burnpack" else {}
        dropped = [] if fmt == "burnpack" else [f"scalar '{k}'" for k in reader.scalars]
        if fmt not in METADATA_FORMATS:
            dropped += [f"metadata '{k}'" for k in reader.metadata]
        written = save(reader.tensors, dst, format=fmt, metadata=meta, scalars=scalars, overwrite=overwrite,
                       protect=[reader.path] if reader.path else [])
        return ConvertResult(
            source=str(src), source_format=reader.format, target=written, target_format=fmt,
            tensors=len(reader.tensors), nbytes=sum(t.nbytes for t in reader.tensors), metadata=meta,
            scalars_written=len(scalars), dropped=dropped,
        )

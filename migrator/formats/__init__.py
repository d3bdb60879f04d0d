"""Formats: open any supported file lazily, save lazy tensors atomically in any format."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from operator import attrgetter
from typing import Any, BinaryIO

from ..atomic import Protected, atomic_output
from ..bytesource import ByteSource, open_source
from ..errors import UnknownFormatError
from ..scalars import Scalar
from ..tensor import LazyTensor
from .base import Reader, Writer
from .detect import FORMATS, detect, target_format

__all__ = ["FORMATS", "Reader", "Writer", "open_file", "save", "save_planned", "to_bytes", "writer_class"]

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | ByteSource


def reader_class(fmt: str) -> type[Reader]:
    if fmt == "burnpack":
        from .burnpack import BurnpackReader

        return BurnpackReader
    if fmt == "safetensors":
        from .safetensors import SafetensorsReader

        return SafetensorsReader
    if fmt == "pytorch":
        from .pytorch import PytorchReader

        return PytorchReader
    raise UnknownFormatError(f"unknown format '{fmt}' (use one of {', '.join(FORMATS)})")


def writer_class(fmt: str) -> type[Writer]:
    if fmt == "burnpack":
        from .burnpack import BurnpackWriter

        return BurnpackWriter
    if fmt == "safetensors":
        from .safetensors import SafetensorsWriter

        return SafetensorsWriter
    if fmt == "pytorch":
        from .pytorch_writer import PytorchWriter

        return PytorchWriter
    raise UnknownFormatError(f"unknown format '{fmt}' (use one of {', '.join(FORMATS)})")


def open_file(src: Source, format: str = "auto", **options: Any) -> Reader:
    """Open a file or buffer lazily; `options` go to the format's reader (e.g. `top_level_key`)."""
    if isinstance(src, str | os.PathLike) and format in ("auto", "burnpack"):
        from .burnpack import resolve_read_path

        src = resolve_read_path(src)
    source = open_source(src)
    try:
        path = src if isinstance(src, str | os.PathLike) else None
        fmt = detect(source, path) if format == "auto" else format
        cls = reader_class(fmt)
        key = options.pop("top_level_key", None) if not cls.nested_keys else None
        reader = cls(source, **options)
        if key is not None:
            reader.select(key)
        return reader
    except BaseException:
        source.close()
        raise


def save(
    tensors: Sequence[LazyTensor],
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    metadata: Mapping[str, str] | None = None,
    scalars: Mapping[str, Scalar] | None = None,
    overwrite: bool = False,
    protect: Iterable[str | os.PathLike[str]] = (),
    progress: Callable[[BinaryIO, int], AbstractContextManager[None]] | None = None,
    fsync: bool = True,
) -> str:
    """Write `tensors` to `path` atomically; returns the path written.

    `progress(sink, total_bytes)`, if given, is entered around the streaming (e.g. a progress bar).
    `fsync=False` publishes without flushing to disk first (see `migrator.atomic`).
    """
    fmt = target_format(path, format)
    writer = writer_class(fmt)(tensors, metadata=metadata, scalars=scalars)
    # a new file's permissions: those the files the tensors came from share (see migrator.atomic)
    origins = sorted(o for o in set(map(attrgetter("origin"), tensors)) if o and not o.startswith("<"))
    return save_planned(writer, path, overwrite=overwrite, protect=protect, progress=progress, fsync=fsync,
                        mode_from=origins)


def save_planned(
    writer: Writer,
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    protect: Iterable[Protected] = (),
    progress: Callable[[BinaryIO, int], AbstractContextManager[None]] | None = None,
    fsync: bool = True,
    outputs: Iterable[str | os.PathLike[str]] = (),
    mode_from: Iterable[str | os.PathLike[str] | int] = (),
    make_folders: bool = False,
) -> str:
    """Write an already planned `writer` to `path` atomically (see `save`); returns the path written.

    `protect`, `outputs`, `mode_from`, `make_folders`: see `migrator.atomic.atomic_output`.
    """
    out = writer.resolve_path(path)
    with atomic_output(out, overwrite=overwrite, protect=protect, outputs=outputs, expected_size=writer.total_size,
                       fsync=fsync, mode_from=mode_from, make_folders=make_folders) as sink:
        if progress is None:
            writer.write_to(sink)
        else:
            with progress(sink, writer.total_size):
                writer.write_to(sink)
    return out


def to_bytes(
    tensors: Sequence[LazyTensor],
    format: str,
    *,
    metadata: Mapping[str, str] | None = None,
    scalars: Mapping[str, Scalar] | None = None,
) -> bytes:
    """Write `tensors` into memory (Burn's `into_bytes`)."""
    writer = writer_class(format)(tensors, metadata=metadata, scalars=scalars)
    buf = io.BytesIO()
    writer.write_to(buf)
    return buf.getvalue()

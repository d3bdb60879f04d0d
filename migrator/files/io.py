"""Open any supported file, folder, index, glob or URL lazily; save lazy tensors atomically in any format."""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from operator import attrgetter
from typing import TYPE_CHECKING, Any, cast

from ..core.bytesource import ByteSource
from ..core.limits import DEFAULT_LIMITS, Limits
from ..core.scalars import Scalar
from ..core.tensor import LazyTensor
from ..formats.base import Reader, Writer, WriterKind
from ..formats.registry import reader_class, target_format, writer_class
from ..storage.atomic import Protected, atomic_output
from ..storage.read_context import ReadContext
from ..storage.remote import is_url
from .probes import Asked, no_order, no_tag, probed
from .single import open_single, reader_over
from .write_options import DEFAULT_WRITE, WriteOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..storage.remote.options import StorageOptions
    from .write_options import Progress, SaveKeywords, WriteKeywords

__all__ = ["Reader", "WriteOptions", "Writer", "open_file", "reader_class", "reader_over", "save", "save_planned",
           "to_bytes", "writer_class"]

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | ByteSource


def open_file(src: Source, format: str = "auto", *, limits: Limits = DEFAULT_LIMITS,
              storage: StorageOptions | None = None, **options: Any) -> Reader:
    """Open a file or buffer lazily; `options` go to the format's reader (e.g. `top_level_key`).

    `limits` bounds what the file may make the reader allocate (`migrator.core.limits.Limits`);
    `storage`: the options a URL is opened with (a recipe's `storage_options:`).

    A path may also name a model folder, an index (`*.index.json`) or a glob of shards: all its
    shards are then read as one source (`files.sharded`).

    `training_state="keep"` with `keep_structure`: a DeepSpeed ZeRO folder lists the whole training
    checkpoint (fp32 model and optimizer state) instead of its fp32 weights alone, and a Hugging Face
    Trainer checkpoint folder its model and `optimizer.pt` (`files.trainer`; `param_order`: a file whose
    tensor names give the model's parameter order, else transformers derives it). Other sources need
    no such word: their structure is the file's own, kept by `keep_structure` alone.

    A model folder (or its `model.safetensors`), local or on a store, whose config.json declares a
    quantization scheme is read through `files.quantized`: its tensors as stored, checked against the
    declaration, or with
    `dequantize="BF16"` (F16, F32...) each quantized weight dequantized under its own name.
    """
    whole = options.pop("training_state", None) == "keep"
    order = options.pop("param_order", None)
    dequantize = options.pop("dequantize", None)
    if isinstance(src, str | os.PathLike):
        if is_url(src):  # an object store: ranged reads (migrator.storage.remote)
            from .remote_open import open_url

            no_tag(src, options)
            no_order(src, order)
            remote = open_url(src, format, options, ReadContext(limits, storage))
            from .quantized import quantized_source

            return quantized_source(remote, src, dequantize=dequantize, storage=storage)
        from ..storage.remote import local_of

        src = local_of(src)  # file:///x reads /x
        reader = probed(Asked(src, format, limits, options, whole, order))  # a folder format, rank files, shards
        if reader is None:
            reader = open_single(src, format, limits, options)
        from .quantized import quantized_source

        return quantized_source(reader, src, dequantize=dequantize)
    no_tag("<memory>", options)
    no_order("<memory>", order)
    return open_single(src, format, limits, options)


def save(
    tensors: Sequence[LazyTensor] | Mapping[str, Any],
    path: str | os.PathLike[str],
    options: WriteOptions = DEFAULT_WRITE,
    *,
    format: str = "auto",
    metadata: Mapping[str, str] | None = None,
    scalars: Mapping[str, Scalar | bool | int | float] | None = None,
    max_shard_size: int | str | None = None,
    **write: Unpack[SaveKeywords],
) -> str:
    """Write `tensors` to `path` atomically; returns the path written.

    `tensors`: LazyTensors, or a mapping of name -> LazyTensor / numpy array / torch tensor (a
    reader is one); `scalars`: `Scalar`s or plain bools, ints and floats (Burn's variant for each).

    How it is written: `options` (a `WriteOptions`), or its keywords `overwrite`, `protect`, `progress`
    and `fsync` (laid over `options`). `progress(sink, total_bytes)`, if given, is entered around the
    streaming (e.g. a progress bar). `fsync=False` publishes without flushing to disk first (see
    `migrator.storage.atomic`). A new file takes the permission bits the files the tensors came from share.
    `max_shard_size` (e.g. "5GB"): write `path` as a folder of shards plus an index, published whole
    (`format` auto: the extension's, else SafeTensors, as every sharded target; see `files.sharded_writer`).
    """
    from ..core.arrays import as_scalars
    from ..core.tensor import as_tensors

    options = options.with_keywords(write)
    tensors, scalars = as_tensors(tensors), as_scalars(scalars)
    if max_shard_size is not None:
        from .sharded_writer import FolderLayout, ShardedWriter

        shard_fmt = target_format(path, format, sharded=True)
        sharded = ShardedWriter(shard_fmt, tensors, metadata=metadata, scalars=scalars,
                                folder=FolderLayout(max_size=max_shard_size))
        # as before this took WriteOptions: a sharded save is given no `protect` (nor the sources' modes)
        return save_planned(sharded, path, dataclasses.replace(options, protect=()))
    fmt = target_format(path, format)
    writer = writer_class(fmt)(tensors, metadata=metadata, scalars=scalars)
    # a new file's permissions: those the files the tensors came from share (see migrator.storage.atomic)
    origins = sorted(o for o in set(map(attrgetter("origin"), tensors)) if o and not o.startswith("<"))
    return save_planned(writer, path, dataclasses.replace(options, mode_from=origins))


def save_planned(
    writer: Writer,
    path: str | os.PathLike[str],
    options: WriteOptions = DEFAULT_WRITE,
    **write: Unpack[WriteKeywords],
) -> str:
    """Write an already planned `writer` to `path` atomically (see `save`); returns the path written.

    How: `options` (`WriteOptions`), or its fields as keywords (laid over `options`); `protect`,
    `outputs`, `mode_from`, `make_folders`: see `migrator.storage.atomic.atomic_output`. A
    `ShardedWriter` writes a folder, published whole (`migrator.storage.atomic_folder`). `storage`:
    the options a URL is written with.
    """
    o = options.with_keywords(write)
    overwrite, protect, progress, fsync = o.overwrite, o.protect, o.progress, o.fsync
    outputs, mode_from, make_folders, storage = o.outputs, o.mode_from, o.make_folders, o.storage
    if is_url(path):  # an object store: a multipart upload, or shards published index-last
        return _save_remote(writer, path, overwrite=overwrite, protect=protect, progress=progress, storage=storage)
    if writer.kind is WriterKind.FOLDER:
        from .sharded_writer import ShardedWriter, save_sharded

        return save_sharded(cast(ShardedWriter, writer), path, overwrite=overwrite, progress=progress, fsync=fsync,
                            protect=protected_files(protect), outputs=outputs, mode_from=mode_from)
    out = writer.resolve_path(path)
    with atomic_output(out, overwrite=overwrite, protect=protected_files(protect), outputs=outputs,
                       expected_size=writer.total_size, fsync=fsync, mode_from=mode_from,
                       make_folders=make_folders) as sink:
        if progress is None:
            writer.write_to(sink)
        else:
            with progress(sink, writer.total_size):
                writer.write_to(sink)
    return out


def save_planned_together(parts: Sequence[tuple[Writer, str | os.PathLike[str]]], *, overwrite: bool = False,
                          protect: Iterable[Protected] = (), fsync: bool = True,
                          outputs: Iterable[str | os.PathLike[str]] = (),
                          mode_from: Iterable[str | os.PathLike[str] | int] = (), make_folders: bool = False) -> str:
    """Local files that belong together (Burn's LR scheduler record, its optimizer record, then the model),
    through `storage.atomic_pair.atomic_outputs`: all written whole and synced, every check made, before
    any is renamed; renamed in the order given, the last (the model) being the commit point, so a new
    model is never beside an old record; an error in any publishes none. Returns the last path written."""
    from ..storage.atomic_pair import atomic_outputs

    paths = [w.resolve_path(p) for w, p in parts]
    with atomic_outputs(paths, overwrite=overwrite, protect=protected_files(protect), outputs=outputs,
                        expected_sizes=[w.total_size for w, _ in parts], fsync=fsync, mode_from=mode_from,
                        make_folders=make_folders) as sinks:
        for (writer, _), sink in zip(parts, sinks, strict=True):
            writer.write_to(sink)
    return paths[-1]


def _save_remote(writer: Writer, path: str | os.PathLike[str], *, overwrite: bool, protect: Iterable[Protected],
                 progress: Progress | None = None, storage: StorageOptions | None = None) -> str:
    from ..storage.remote import url_of

    url = url_of(path)
    if writer.kind is WriterKind.FOLDER:
        from .remote_sharded import save_sharded_remote

        return save_sharded_remote(writer, url, overwrite=overwrite, progress=progress, storage=storage)
    from ..storage.remote.upload import remote_output

    out = url_of(writer.resolve_path(url))
    with (remote_output(out, overwrite=overwrite, expected_size=writer.total_size, protect=protect,
                        storage=storage) as sink,
          progress(sink, writer.total_size) if progress is not None else nullcontext()):
        writer.write_to(sink)
    return out


def protected_files(protect: Iterable[Protected]) -> list[Protected]:
    """The files a write must not replace: a sharded source (folder, index, glob) stands for every
    file of its folder (or every match of its glob), so no shard or index is replaced while read."""
    import glob as globlib

    from .sharded import INDEX_SUFFIX, is_sharded_path

    out: list[Protected] = []
    for p in protect:
        if isinstance(p, tuple):  # a (device, inode) identity of a file held open
            out.append(p)
            continue
        text = os.fspath(p)
        if is_url(text) or not is_sharded_path(text):  # a URL is no local file: nothing to expand
            out.append(p)
            continue
        folder = text if os.path.isdir(text) else os.path.dirname(text) or "."
        names = globlib.glob(text) if not os.path.isdir(text) and not text.endswith(INDEX_SUFFIX) else \
            [os.path.join(folder, n) for n in os.listdir(folder)]
        out += names
    return out


def to_bytes(
    tensors: Sequence[LazyTensor] | Mapping[str, Any],
    format: str,
    *,
    metadata: Mapping[str, str] | None = None,
    scalars: Mapping[str, Scalar | bool | int | float] | None = None,
) -> bytes:
    """Write `tensors` into memory (Burn's `into_bytes`); takes what `save` takes."""
    from ..core.arrays import as_scalars
    from ..core.tensor import as_tensors

    writer = writer_class(format)(as_tensors(tensors), metadata=metadata, scalars=as_scalars(scalars))
    buf = io.BytesIO()
    writer.write_to(buf)
    return buf.getvalue()

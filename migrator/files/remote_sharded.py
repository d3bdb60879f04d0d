"""Model folders on object stores: reading a folder, index or glob of shard objects, and publishing one.

Reading: the folder's listing (or the index, or fsspec's glob) names the shards; each shard's header
is read by ranged requests (`RemoteSource`) and its tensors stream from it as any remote tensor.
The same checks as for a local folder hold (`files.sharded`): no tensor in two shards, the index
and the shards agree, one format; an index's shard names stay inside its prefix.

Publishing (`save_sharded_remote`): an object store has no folder rename, so the folder is published
index-last. Every shard is uploaded as its own atomic object (`upload.remote_output`), then the
companion files, and the index object only after all of them completed: a reader that goes by the
index never sees a partial model, and an interrupted run leaves no index (the shards it completed
are deleted again, unless the process is killed outright); a DCP checkpoint's index is its
`.metadata`. Overwriting first deletes the old index,
so a reader never pairs the old index with new shards; the old weights objects that the new model
does not reuse (`is_model_part` names: single weights file, numbered shards) are deleted after the
new index is written. Every other object under the prefix is the user's and is kept.
"""

from __future__ import annotations

import contextlib
import glob
import json
import posixpath
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, BinaryIO

from ..core.errors import FormatError, LimitExceededError, OutputError, TargetExistsError
from ..core.scalars import Scalar
from ..formats.bounded_json import load_bounded_json
from ..formats.registry import default_sharded
from ..storage.read_context import DEFAULT_READ, ReadContext
from ..storage.remote import RemotePath, as_path, protocol, redact, url_of
from ..storage.remote.fs import (
    StorageError,
    copy_companion,
    deadline,
    filesystem,
    object_info,
    stream_size,
    tuning,
    with_retries,
)
from ..storage.remote.options import StorageOptions
from ..storage.remote.source import RemoteSource
from .sharded import (
    GLOB_CHARS,
    INDEX_SUFFIX,
    ShardedReader,
    ShardSet,
    _check_against_index,
    index_fields,
    is_model_part,
    name_problem,
    pick_weights,
)


def _join(folder: str, name: str) -> str:
    return folder.rstrip("/") + "/" + name


def _listing(url: str, missing_ok: bool = False, storage: StorageOptions | None = None) -> set[str]:
    fs, path = filesystem(url, storage)
    with contextlib.suppress(AttributeError, TypeError):
        fs.invalidate_cache(path)
    try:
        entries = with_retries(lambda: fs.ls(path, detail=True, **deadline(fs, tuning(url, storage))), url,
                               "cannot list the folder")
    except StorageError as e:
        if missing_ok and e.detail.endswith("no such object"):
            return set()
        raise
    return {posixpath.basename(e["name"].rstrip("/")) for e in entries if e.get("type") != "directory"}


def glob_companions(folder: str, pattern: str, storage: StorageOptions | None = None) -> list[tuple[Path, str]]:
    """(URL as a `RemotePath`, path relative to `folder`) of each object under the store folder
    `folder` that `pattern` matches (fsspec's glob), in sorted order; folders are left out."""
    fs, base = filesystem(folder, storage)
    base = base.rstrip("/")
    tune = tuning(folder, storage)
    if not glob.has_magic(pattern):
        # fsspec's glob of a plain name asks `exists`, which answers False for any error: a server that
        # timed out would read as "no such file". A HEAD says which it was.
        name = base + "/" + pattern
        try:
            info = with_retries(lambda: object_info(fs, name, tune), folder, "cannot list companion files", tune)
        except StorageError as e:
            if e.detail.endswith("no such object"):
                return []
            raise
        found = {info.get("name", name): info}
    else:
        found = with_retries(lambda: fs.glob(base + "/" + pattern, detail=True, **deadline(fs, tune)),
                             folder, "cannot list companion files", tune)
    out: list[tuple[Path, str]] = []
    for path, info in sorted(found.items()):
        if info.get("type") == "directory":
            continue
        rel = posixpath.relpath(path.rstrip("/"), base)
        problem = name_problem(rel, url=True)
        if problem is not None or not (path.rstrip("/") + "/").startswith(base + "/"):
            raise FormatError(f"companion '{rel}' leaves the source folder {redact(folder)}: "
                              f"{problem or 'it is not under it'}", file=redact(folder))
        out.append((as_path(_join(folder, rel)), rel))
    return out


def is_remote_sharded(url: str, info: dict[str, Any] | None) -> bool:
    """Whether a URL names a folder (a prefix), an index or a glob rather than one object."""
    if url.endswith(("/", INDEX_SUFFIX)):
        return True
    if info is not None and info.get("type") == "directory":
        return True
    return info is None and bool(GLOB_CHARS.intersection(posixpath.basename(url)))


def read_remote_index(url: str, read: ReadContext = DEFAULT_READ) -> tuple[dict[str, str], dict[str, Any]]:
    """A remote index's `weight_map` and `metadata` (size bounded before it is read)."""
    limits = read.limits
    src = RemoteSource(url, storage=read.storage)
    try:
        if src.size > limits.max_index_bytes:
            raise LimitExceededError(f"index is {src.size} bytes, over the {limits.max_index_bytes} limit "
                                     "(max_index_bytes)", file=src.label)
        raw = src.read(0, src.size, "index")
    finally:
        src.close()
    return index_fields(load_bounded_json(raw, limits, redact(url), "index"), redact(url))


class _RemoteShard:
    __slots__ = ("label", "path", "size", "source")

    def __init__(self, path: RemotePath, source: RemoteSource) -> None:
        self.path, self.source, self.size, self.label = path, source, source.size, source.label


class RemoteShardedReader(ShardedReader):
    """`ShardedReader` over shard objects (shard order, then each shard's data order)."""

    def __init__(self, url: str, format: str = "auto", info: dict[str, Any] | None = None,
                 read: ReadContext = DEFAULT_READ) -> None:
        url = url.rstrip("/") if not url.endswith("://") else url
        self.given = redact(url)
        self.limits = limits = read.limits
        self.storage = storage = read.storage
        self.index_path = None
        weight_map: dict[str, str] | None = None
        index_meta: dict[str, Any] = {}
        if url.endswith(INDEX_SUFFIX):
            self.index_path = RemotePath(url)
            self.folder = self.index_path.parent
            weight_map, index_meta = read_remote_index(url, read)
            files = self._index_files(url, weight_map)
        elif info is None and GLOB_CHARS.intersection(posixpath.basename(url)):
            if protocol(url) in ("http", "https"):
                raise FormatError("a glob needs a store that lists objects; http(s):// does not: name the index",
                                  file=self.given)
            fs, path = filesystem(url, storage)
            found = with_retries(lambda: fs.glob(path, **deadline(fs, tuning(url, storage))), url,
                                 "cannot list the glob")
            proto = protocol(url)
            files = [RemotePath(url_of(f"{proto}://{p.lstrip('/')}")) for p in sorted(found)]
            self.folder = RemotePath(posixpath.dirname(url))
            if not files:
                raise FormatError("no object matches this glob", file=self.given)
        else:
            self.folder = RemotePath(url)
            found_path = pick_weights(_listing(url, storage=storage), self.folder)
            if found_path.name.endswith(INDEX_SUFFIX):
                self.index_path = RemotePath(str(found_path))
                weight_map, index_meta = read_remote_index(str(found_path), read)
                files = self._index_files(str(found_path), weight_map)
            else:
                files = [RemotePath(str(found_path))]
        if len(files) > limits.max_shards:
            raise LimitExceededError(f"{len(files)} shards, over the {limits.max_shards} limit (max_shards)",
                                     file=self.given)
        self.shards = []
        self.shard_of = {}
        self.locations = []
        self.tensors = []
        self.scalars: dict[str, Scalar] = {}
        self._open_remote(files, format)
        if weight_map is not None:
            assert self.index_path is not None
            _check_against_index(self.index_path, weight_map, self)
        self.metadata = {k: v if isinstance(v, str) else json.dumps(v) for k, v in index_meta.items()
                         if k != "total_size"} | self._shard_metadata
        self.source = ShardSet(self.given, sum(s.size for s in self.shards))

    def _index_files(self, index: str, weight_map: dict[str, str]) -> list[RemotePath]:
        folder = posixpath.dirname(index)
        files: list[RemotePath] = []
        seen: set[str] = set()
        for rel in sorted(set(weight_map.values())):
            norm = posixpath.normpath(rel)
            if norm in seen:
                continue
            seen.add(norm)
            problem = name_problem(rel, url=True)
            if problem is not None:
                raise FormatError(f"shard path '{rel}' leaves the index's folder {redact(folder)}: {problem}",
                                  file=redact(index))
            files.append(RemotePath(_join(folder, norm)))
        return files

    def _open_remote(self, files: list[RemotePath], fmt: str) -> None:
        from ..formats.detect import detect
        from ..formats.registry import reader_class

        formats: dict[str, str] = {}
        metas: dict[str, set[str]] = {}
        scalar_from: dict[str, str] = {}
        for i, path in enumerate(files):
            try:
                source = RemoteSource(str(path), storage=self.storage)
            except FormatError as e:
                if self.index_path is not None and e.detail.startswith("cannot open: no such object"):
                    raise FormatError(f"shard {redact(str(path))} named by the index is missing",
                                      file=redact(str(self.index_path))) from None
                raise
            except Exception:
                raise
            try:
                shard_fmt = detect(source, str(path)) if fmt == "auto" else fmt
                reader = reader_class(shard_fmt)(source, limits=self.limits)  # type: ignore[call-arg]
            except BaseException:
                source.close()
                raise
            formats.setdefault(reader.format, source.label)
            if len(formats) > 1:
                (f1, p1), (f2, p2) = list(formats.items())[:2]
                raise FormatError(f"mixed formats in one source: {p1} is {f1}, {p2} is {f2}", file=self.given)
            self.shards.append(_RemoteShard(path, source))  # type: ignore[arg-type]
            for t in reader.tensors:
                other = self.shard_of.get(t.name)
                if other is not None:
                    raise FormatError(f"tensor '{t.name}' is in two shards: {self.shards[other].label} and "
                                      f"{source.label}", file=self.given)
                self.shard_of[t.name] = i
                self.locations.append((i, None))
                self.tensors.append(t)
            for k, v in reader.metadata.items():
                metas.setdefault(k, set()).add(v)
            for k, s in reader.scalars.items():
                if k in self.scalars and self.scalars[k] != s:
                    raise FormatError(f"scalar '{k}' differs between shards {scalar_from[k]} and {source.label}",
                                      file=self.given)
                self.scalars[k], scalar_from[k] = s, source.label
        self.format = next(iter(formats)) if formats else default_sharded().name  # type: ignore[misc]
        self._ggml_types = {}
        self._shard_metadata = {k: next(iter(v)) for k, v in metas.items() if len(v) == 1}

    def file_of(self, index: int) -> str:
        return self.shards[self.locations[index][0]].label

    def close(self) -> None:
        for s in self.shards:
            s.source.close()  # type: ignore[attr-defined]


def check_remote_folder(url: str, *, overwrite: bool, storage: StorageOptions | None = None) -> None:
    """Refuse a target prefix that already holds a model (its index or a weights file) without overwrite."""
    if not overwrite:
        names = _listing(url, missing_ok=True, storage=storage)
        held = sorted(n for n in names if n.endswith((INDEX_SUFFIX, ".safetensors", ".bin", ".pt")))
        if held:
            raise TargetExistsError(f"target folder exists and holds a model ({', '.join(held[:3])}); "
                                    "use --overwrite (target.overwrite: true) to replace it", file=redact(url))


def save_sharded_remote(writer: Any, url: str, *, overwrite: bool,
                        progress: Callable[[BinaryIO, int], AbstractContextManager[None]] | None = None,
                        storage: StorageOptions | None = None) -> str:
    """Upload a `ShardedWriter`'s shards, companions and index to the prefix `url`, index last (the
    target's and the companions' storage options in `storage`)."""
    from ..storage.remote.upload import delete, remote_output

    folder = url.rstrip("/")
    check_remote_folder(folder, overwrite=overwrite, storage=storage)
    old = _listing(folder, missing_ok=True, storage=storage) if overwrite else set()
    index_name = writer.index_name if writer.index is not None else None
    old_indexes = sorted(n for n in old if (n.endswith(INDEX_SUFFIX) and is_model_part(n)) or n == index_name)
    for n in old_indexes:  # readers going by the index now see no model until the new one is complete
        delete(_join(folder, n), storage)
    names: list[str] = []
    try:
        for name, shard in writer.files:
            with (remote_output(_join(folder, name), overwrite=overwrite, expected_size=shard.total_size,
                                storage=storage) as sink,
                  progress(sink, shard.total_size) if progress is not None else contextlib.nullcontext()):
                shard.write_to(sink)
            names.append(name)
        for src, name in writer.copies:
            size = stream_size(src, storage)
            with remote_output(_join(folder, name), overwrite=overwrite, expected_size=size, storage=storage) as sink:
                copy_companion(src, sink, size, storage)
            names.append(name)
        for name, data in writer.generated:
            with remote_output(_join(folder, name), overwrite=overwrite, expected_size=len(data),
                               storage=storage) as sink:
                sink.write(data)
            names.append(name)
    except BaseException:
        # no index will name them: remove the objects this run completed (with overwrite, old
        # objects of the same names were replaced and are gone either way)
        for name in names:
            with contextlib.suppress(Exception):
                delete(_join(folder, name), storage)
        raise
    if index_name is not None:
        data = writer.index_bytes()
        with remote_output(_join(folder, index_name), overwrite=overwrite, expected_size=len(data),
                               storage=storage) as sink:
            sink.write(data)
        names.append(index_name)
    # only the old model's weights: every other object under the prefix is the user's, and is kept
    stale = sorted(n for n in old if n not in names and is_model_part(n))
    for n in stale:
        with contextlib.suppress(OutputError):  # an old shard nothing points to any more: harmless to leave
            delete(_join(folder, n), storage)
    return folder + "/"

"""Opening a URL as a reader: one object, or a folder / index / glob of shard objects."""

from __future__ import annotations

import os
from typing import Any

from ..formats.base import Reader
from ..formats.dcp.layout import METADATA_FILE
from ..storage.read_context import DEFAULT_READ, ReadContext
from ..storage.remote import redact, url_of
from ..storage.remote.fs import StorageError, filesystem, object_info, tuning, with_retries
from ..storage.remote.options import StorageOptions


def open_url(src: str | os.PathLike[str], format: str, options: dict[str, Any],
             read: ReadContext = DEFAULT_READ) -> Reader:
    """`files.io.open_file` for a URL, within `read`: headers by ranged reads, tensors streamed on demand."""
    from ..storage.remote.source import RemoteSource
    from .remote_sharded import RemoteShardedReader, is_remote_sharded
    from .single import reader_over

    url, storage = url_of(src), read.storage
    info: dict[str, Any] | None = None
    if not url.endswith("/"):
        fs, path = filesystem(url, storage)
        try:
            tune = tuning(url, storage)
            info = with_retries(lambda: object_info(fs, path, tune), url, "cannot open", tune)
        except Exception as e:
            if "no such object" not in str(e) or not set("*?[").intersection(os.path.basename(url)):
                raise
    if is_remote_sharded(url, info) or url.rstrip("/").endswith("/" + METADATA_FILE):
        folder = remote_dcp_folder(url, storage)
        if folder is not None:  # a PyTorch Distributed Checkpoint on a store: `.metadata` + .distcp objects
            from .multi_rank import open_dcp

            return open_dcp(folder, options, read)
    if is_remote_sharded(url, info):
        key = options.pop("top_level_key", None)
        options.pop("keep_structure", None)  # shards are state_dicts: written back flat
        if options:
            raise TypeError(f"options {sorted(options)} do not apply to a sharded source")
        sharded = RemoteShardedReader(url, format, info, read)
        try:
            if key is not None:
                sharded.select(key)
        except BaseException:
            sharded.close()
            raise
        return sharded
    assert info is not None
    source = RemoteSource(url, size=info.get("size") if isinstance(info.get("size"), int) else None, storage=storage)
    return reader_over(source, url, format, read.limits, options)


def remote_dcp_folder(url: str, storage: StorageOptions | None = None) -> str | None:
    """The DCP checkpoint a folder URL (or its `.metadata` object's) names: the folder, when it holds
    `.metadata` (one HEAD); None otherwise."""
    base = url.rstrip("/")
    if base.endswith("/" + METADATA_FILE):
        return base[: -len(METADATA_FILE) - 1]
    fs, path = filesystem(base + "/" + METADATA_FILE, storage)
    tune = tuning(url, storage)
    try:
        info = with_retries(lambda: object_info(fs, path, tune), url, "cannot open", tune)
    except StorageError as e:
        if e.detail.endswith("no such object"):
            return None
        raise
    return base if info.get("type") != "directory" else None


def label(src: str | os.PathLike[str]) -> str:
    return redact(url_of(src))

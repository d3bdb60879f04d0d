"""`DcpReader`: a PyTorch Distributed Checkpoint folder (`.metadata` + `__R_K.distcp`) as one source.

Every global tensor is assembled from its chunks (`assemble.py`), lazily: opening reads `.metadata`
and each chunk's small torch.save header, never tensor bytes. Names are DCP's flattened keys
(`model.layers.0.weight`, `optim.state.layers.0.weight.exp_avg`); `top_level_key` selects a prefix as
for a `.pt`. Non-tensor values (`optim.param_groups.0.lr`, a step count) are read with the restricted
interpreter: numbers become scalars, strings metadata, and with `keep_structure` the whole nested
state dict is kept (`formats.pytorch.tree`) so a `.pt` target is what `dcp_to_torch_save` writes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import PosixPath
from typing import TYPE_CHECKING, Any

from ...core.bytesource import ByteSource
from ...core.errors import FormatError, LimitExceededError
from ...core.reopening import Descriptors, reopening
from ...core.scalars import Scalar
from ...core.tensor import LazyTensor
from ...storage.paths import require_inside
from ...storage.read_context import DEFAULT_READ, ReadContext
from ...storage.remote import as_path, is_url
from ..base import Reader
from .assemble import Piece, assemble
from .layout import METADATA_FILE
from .metadata import read_metadata
from .storage import chunk_tensor, item_value
from .tree import build_tree

if TYPE_CHECKING:
    pass

MAX_METADATA_BYTES = 1 << 30


class DcpSource(ByteSource):
    """The reader's `source`: the folder's label, the files' identities and shared permission bits."""

    def __init__(self, path: str, size: int, identities: Sequence[tuple[int, int]], mode: int) -> None:
        self.path, self.label, self.size = path, path, size
        self.identities, self.mode = list(identities), mode

    def view(self, offset: int, length: int) -> memoryview:
        raise FormatError("a DCP checkpoint has no single byte range; read its tensors", file=self.label)


class DcpReader(Reader):
    format = "dcp"
    keeps_structure = True

    def __init__(self, folder: str | os.PathLike[str], *, read: ReadContext = DEFAULT_READ,
                 keep_structure: bool = False) -> None:
        self.folder = self.root = as_path(folder)  # a local folder, or an object-store prefix
        self.limits = read.limits
        self.storage = read.storage
        meta_path = self.folder / METADATA_FILE
        self._files: dict[str, ByteSource] = {}
        self.fds = Descriptors()
        self.tensors: list[LazyTensor] = []
        self.scalars: dict[str, Scalar] = {}
        self.metadata: dict[str, str] = {}
        self.plain_values: dict[str, Any] = {}
        self.label_meta = str(meta_path)
        try:
            self._open(meta_path, keep_structure)
        except BaseException:
            self.close()
            raise

    def _open(self, meta_path: PosixPath, keep_structure: bool) -> None:
        src = self._source(meta_path, METADATA_FILE)
        try:
            if src.size > MAX_METADATA_BYTES:
                raise LimitExceededError(f"{METADATA_FILE} is {src.size} bytes (limit {MAX_METADATA_BYTES})",
                                         file=str(meta_path))
            meta = read_metadata(src.read(0, src.size, METADATA_FILE), str(meta_path), self.limits)
        finally:
            src.close()
        self.meta = meta
        if len(meta.files) > self.limits.max_shards:
            raise LimitExceededError(f"{len(meta.files)} storage files, over the {self.limits.max_shards} limit "
                                     "(max_shards)", file=str(meta_path))
        label = str(meta_path)
        by_name: dict[str, LazyTensor] = {}
        self._chunk_files: dict[str, list[str]] = {}
        self.pieces: dict[str, list[Piece]] = {}  # each tensor's chunks, for a reader that cuts them anew
        for name, entry in meta.tensors.items():
            pieces = []
            for chunk in entry.chunks:
                loc = meta.location(name, chunk.offsets, label)
                source = self._file(loc.file, name)
                t = chunk_tensor(source, loc.offset, loc.length, self.limits, name)
                pieces.append(Piece(chunk.offsets, chunk.sizes, source.label, t))
            by_name[name] = assemble(name, entry.dtype, entry.size, pieces, label, self.limits)
            self.pieces[name] = pieces
            self._chunk_files[name] = sorted({p.file for p in pieces})
        for name in meta.byte_values:
            loc = meta.location(name, None, label)
            self.plain_values[name] = item_value(self._file(loc.file, name), loc.offset, loc.length, self.limits, name)
        self.structure = None
        tree, order = build_tree(meta, self.plain_values, label, self.limits)
        if keep_structure:
            self.structure = tree
        self.tensors = [by_name[n].renamed(n) if by_name[n].name != n else by_name[n] for n in order]
        _plain_leaves(self.plain_values, self.scalars, self.metadata)
        sizes = [f.size for f in self._files.values()]
        modes = 0o7777
        for f in self._files.values():
            modes &= f.mode if f.mode is not None else 0o7777
        self.source = DcpSource(str(self.folder), sum(sizes),
                                [f.identity for f in self._files.values() if f.identity is not None], modes)

    def _source(self, path: PosixPath, name: str) -> ByteSource:
        """A local file, or an object by ranged reads (`storage.remote.source`), named in errors as missing."""
        if is_url(str(path)):
            from ...storage.remote.fs import StorageError
            from ...storage.remote.source import RemoteSource

            try:
                return RemoteSource(str(path), storage=self.storage)
            except StorageError as e:
                if e.detail.endswith("no such object"):
                    raise FormatError(f"storage file {e.file} named by {METADATA_FILE} is missing",
                                      file=str(self.folder), tensor=name) from None
                raise
        if not path.is_file():
            raise FormatError(f"storage file {path} named by {METADATA_FILE} is missing", file=str(self.folder),
                              tensor=name)
        require_inside(path, self.root, str(self.root), "storage file")
        return reopening(path, self.fds)  # a few descriptors for any number of ranks (`core.reopening`)

    def _file(self, rel: str, name: str) -> ByteSource:
        found = self._files.get(rel)
        if found is None:
            found = self._files[rel] = self._source(self.root / rel, name)
        return found

    def select(self, top_level_key: str | Sequence[str]) -> None:
        super().select(top_level_key)
        prefix = (top_level_key if isinstance(top_level_key, str) else ".".join(top_level_key)) + "."
        self.scalars = {k[len(prefix):]: v for k, v in self.scalars.items() if k.startswith(prefix)}
        self.metadata = {k[len(prefix):]: v for k, v in self.metadata.items() if k.startswith(prefix)}
        self.structure = None

    def extra(self) -> dict[str, Any]:
        return {"container": "dcp", "dcp_version": self.meta.version,
                "files": [{"file": f.label, "file_size": f.size} for f in self._files.values()],
                "values": sorted(self.plain_values)[:100],
                "chunks": {n: len(self.meta.tensors[n].chunks) for n in list(self.meta.tensors)[:1000]}}

    def files_of(self, name: str) -> list[str]:
        """The `.distcp` files that hold a tensor's chunks (by its DCP name)."""
        return self._chunk_files.get(name, [])

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self.fds.close()


def _plain_leaves(values: dict[str, Any], scalars: dict[str, Scalar], metadata: dict[str, str]) -> None:
    """Numbers of the non-tensor values as scalars, strings as metadata (as a `.pt`'s are), by dotted name."""
    todo: list[tuple[str, Any]] = list(values.items())[::-1]
    seen = 0
    while todo and seen < 1_000_000:
        name, v = todo.pop()
        seen += 1
        if isinstance(v, bool | int | float) and not isinstance(v, str):
            with contextlib.suppress(ValueError):  # an integer beyond 64 bits
                scalars[name] = Scalar.of(v)
        elif isinstance(v, str):
            metadata[name] = v
        elif isinstance(v, dict):
            todo += [(f"{name}.{k}", x) for k, x in v.items() if type(k) in (str, int)][::-1]
        elif isinstance(v, (list, tuple)):
            todo += [(f"{name}.{i}", x) for i, x in enumerate(v)][::-1]

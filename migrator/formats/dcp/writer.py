"""`DcpWriter`: a PyTorch Distributed Checkpoint folder, `.metadata` and `__0_0.distcp`, without torch.

What one rank's `torch.distributed.checkpoint.save` with the default `FileSystemWriter` writes: each
tensor (whole, one chunk) and each other value as a `torch.save` archive appended to `__0_0.distcp`
(`items`), and `.metadata` saying where each one is (`metadata_writer`). Every archive's size is
known from its header alone, so `.metadata` is planned before any tensor byte moves, tensors are
streamed through (a kernel copy of a stored span, or a computed tensor piece by piece), and the folder
is published whole (`storage.atomic_folder`, as a folder of shards is). A checkpoint of one rank is
what DCP reshards on load: `dcp.load` on any number of ranks, into FSDP2's DTensors or plain tensors,
reads the chunks each rank needs.

Without a `structure` the state dict is flat (the tensors' names are its keys: `dcp.save(model.
state_dict())`). With one (a training checkpoint kept whole: `{"model": ..., "optim": ...}`) it is
flattened as `dcp.save` flattens it (`flatten`), optimizer state included.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, ClassVar

from ...core.errors import PlanError
from ...core.scalars import Scalar
from ...core.tensor import LazyTensor
from ..base import Writer, WriterKind, utf8_ok
from ..pytorch.tree import Node
from .flatten import Leaf, flatten
from .items import TensorItem, ValueItem
from .layout import METADATA_FILE
from .metadata_writer import Entry, metadata_bytes

DISTCP_FILE = "__0_0.distcp"
"""Rank 0's first file, as `FileSystemWriter` names it (`__{rank}_{n}.distcp`)."""


class DistcpFile(Writer):
    """One `.distcp` file: its items' archives, one after another."""

    format = "dcp"
    default_extension = ".distcp"

    def __init__(self, tensors: Sequence[LazyTensor], items: Sequence[Writer]) -> None:
        super().__init__(tensors)
        self.items = list(items)

    @property
    def total_size(self) -> int:
        return sum(item.total_size for item in self.items)

    def write_to(self, sink: BinaryIO) -> None:
        for item in self.items:
            item.write_to(sink)


class DcpWriter(Writer):
    """A DCP checkpoint folder; saved by `files.sharded_writer.save_sharded` like a folder of shards."""

    format = "dcp"
    default_extension = ""
    kind = WriterKind.FOLDER
    index_name: ClassVar[str] = METADATA_FILE
    """`.metadata` is the checkpoint's index: written after the `.distcp` files (on an object store, the
    old one deleted first and the new one uploaded last, so a reader never pairs it with other files)."""

    def __init__(self, tensors: Sequence[LazyTensor], *, metadata: Mapping[str, str] | None = None,
                 scalars: Mapping[str, Scalar] | None = None, structure: Node | None = None) -> None:
        super().__init__(tensors, metadata=metadata, scalars=scalars)
        self.copies: list[tuple[Any, str]] = []
        self.storage = None
        by_name: dict[str, LazyTensor] = {}
        for t in self.tensors:
            if t.name in by_name:
                raise PlanError("duplicate tensor name", tensor=t.name)
            by_name[t.name] = t
        leaves: list[Leaf] = [((t.name,), t.name, None) for t in self.tensors] if structure is None \
            else flatten(structure)
        leaves += self._extra_values()
        entries: list[Entry] = []
        items: list[Writer] = []
        seen: set[str] = set()
        at = 0
        for path, name, value in leaves:
            fqn = ".".join(map(str, path))
            if fqn in seen:
                raise PlanError("two values of the state dict flatten to this key (DCP joins paths with dots)",
                                tensor=fqn)
            seen.add(fqn)
            if not utf8_ok(fqn):
                raise PlanError("name is not valid UTF-8 text", tensor=fqn)
            if name is not None:
                t = by_name.pop(name)
                item: Writer = TensorItem(t)  # refuses a dtype torch has not
                entries.append(Entry(fqn, path, t.dtype.torch_name, tuple(t.shape), DISTCP_FILE, at, item.total_size))
            else:
                item = ValueItem(value, fqn)
                entries.append(Entry(fqn, path, None, (), DISTCP_FILE, at, item.total_size))
            items.append(item)
            at += item.total_size
        if by_name:
            raise PlanError("the checkpoint structure has no place for this tensor", tensor=next(iter(by_name)))
        self.entries = entries
        self.files: list[tuple[str, Writer]] = [(DISTCP_FILE, DistcpFile(self.tensors, items))]
        self.generated: list[tuple[str, bytes]] = []
        self._metadata = metadata_bytes(entries)
        self.index: dict[str, Any] | None = {"files": [DISTCP_FILE]}  # not None: the folder has an index
        dropped = sorted(self.metadata) + sorted(self.scalars)
        if dropped:
            self.notes.append(f"not written into the DCP checkpoint (a state dict holds tensors and the checkpoint's "
                              f"own values): {', '.join(dropped[:10])}{', ...' if len(dropped) > 10 else ''}")

    def _extra_values(self) -> list[Leaf]:
        """Values a layout adds beside the state dict's own (none in plain DCP)."""
        return []

    def names(self) -> list[str]:
        """The files the checkpoint folder holds."""
        return [DISTCP_FILE, METADATA_FILE]

    def index_bytes(self) -> bytes:
        """`.metadata`'s bytes."""
        return self._metadata

    @property
    def total_size(self) -> int:
        return sum(w.total_size for _, w in self.files) + len(self._metadata)

    def write_to(self, sink: BinaryIO) -> None:
        raise TypeError("a DCP checkpoint is a folder: save it with files.io.save_planned")

    @staticmethod
    def resolve_path(path: str | os.PathLike[str]) -> str:
        return os.path.normpath(os.fspath(path))

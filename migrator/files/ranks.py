"""Per-rank `torch.save` files of DTensors (verl's `model_world_size_N_rank_K.pt`) read as one checkpoint.

Each rank saved its own state dict, whose values are DTensors: the rank's local shard plus a spec
(device mesh, placements). A folder holding such files, a glob matching them or any one of them
names the set; every rank 0..N-1 must be there exactly once, each holding the same tensors with
the same global shapes. The placements decide where each local tensor goes in the global one: along
each mesh dimension, `Shard(d)` splits dimension d as torch does (chunks of ceil(size / n), the last
ones smaller or empty), `Replicate()` leaves it whole (one rank's copy is read). `Partial` (a sum
still to be taken) and `_StridedShard` are refused. The chunks are then assembled as a DCP
checkpoint's are (`formats.dcp.assemble`): checked to tile the tensor, rows streamed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.errors import FormatError
from ..core.limits import DEFAULT_LIMITS, Limits
from ..core.reopening import Descriptors, reopening
from ..core.scalars import Scalar
from ..core.tensor import LazyTensor
from ..formats.base import Reader
from ..formats.dcp.assemble import Piece, assemble
from ..formats.pytorch.dtensor import ShardLayout
from ..formats.pytorch.reader import PytorchReader
from .sharded import ShardSet


def _split(size: int, parts: int, index: int) -> tuple[int, int]:
    """(offset, length) of part `index` when torch shards `size` into `parts` (torch.chunk's sizes)."""
    full = -(-size // parts) if parts else 0
    start = min(full * index, size)
    return start, max(0, min(full, size - start))


def _coordinate(layout: ShardLayout, rank: int) -> tuple[int, ...]:
    """This rank's place on the mesh: the spec's own coordinate, else the rank in row-major order."""
    if layout.coordinate is not None:
        return layout.coordinate
    out = []
    for s in reversed(layout.mesh):
        out.append(rank % s)
        rank //= s
    return tuple(reversed(out))


def chunk_of(layout: ShardLayout, rank: int, label: str, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offsets, sizes) of a rank's local tensor in the global one, as torch computes them (mesh
    dimensions in order, each `Shard(d)` splitting what the ones before left of dimension d)."""
    offsets = [0] * len(layout.size)
    sizes = list(layout.size)
    for mesh_dim, (p, coord) in enumerate(zip(layout.placements, _coordinate(layout, rank), strict=True)):
        if p.kind == "replicate":
            continue
        if p.kind == "partial":
            raise FormatError("a Partial DTensor (a sum still to be reduced across ranks) cannot be joined",
                              file=label, tensor=name)
        if p.kind != "shard":
            raise FormatError(f"DTensor placement {p.kind} is not supported (only Shard and Replicate)", file=label,
                              tensor=name)
        if p.dim >= len(sizes):
            raise FormatError(f"Shard({p.dim}) of a {len(sizes)}-dimensional tensor", file=label, tensor=name)
        start, length = _split(sizes[p.dim], layout.mesh[mesh_dim], coord)
        offsets[p.dim] += start
        sizes[p.dim] = length
    return tuple(offsets), tuple(sizes)


class RanksReader(Reader):
    """Every rank's file as one checkpoint of global tensors (rank 0's order of names)."""

    format = "pytorch"

    def __init__(self, files: Sequence[Path], *, limits: Limits = DEFAULT_LIMITS, first: Reader | None = None,
                 fds: Descriptors | None = None) -> None:
        self._first = first  # rank 0's file, when already open (to learn what the set holds)
        # every rank's bytes are read through one table of a few descriptors (`core.reopening`): a set of
        # 1,024 ranks reads under `ulimit -n 1024`; `first`, when given, reads through `fds` too
        self.fds = fds if fds is not None else Descriptors()
        self.limits = limits
        self.files = list(files)
        self.folder = self.files[0].parent
        self.readers: list[Reader] = []
        self.tensors: list[LazyTensor] = []
        self.metadata: dict[str, str] = {}
        self.scalars: dict[str, Scalar] = {}
        label = str(self.folder)
        try:
            for f in self.files:
                self.readers.append(self._open_rank(f))
            self._join(label)
        except BaseException:
            self.close()
            raise
        self._adopt(self.readers[0])
        modes = 0o7777
        for r in self.readers:
            modes &= r.source.mode or 0
        self.source = ShardSet(label, sum(r.source.size for r in self.readers),
                               [r.source.identity for r in self.readers if r.source.identity], modes)

    def _open_rank(self, f: Path) -> Reader:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return PytorchReader(reopening(f, self.fds), limits=self.limits, dtensor_shards=True)

    def _adopt(self, first: Reader) -> None:
        """What the checkpoint says beside its tensors: rank 0's metadata and scalars."""
        self.metadata, self.scalars = dict(first.metadata), dict(first.scalars)

    def _join(self, label: str) -> None:
        names = self.readers[0].names()
        n = len(self.readers)
        for k, r in enumerate(self.readers[1:], 1):
            if set(r.names()) != set(names):
                extra = sorted(set(r.names()) ^ set(names))[0]
                where = r.label if extra in r else self.readers[0].label
                raise FormatError(f"rank {k} and rank 0 hold different tensors: '{extra}' is only in {where}",
                                  file=label, tensor=extra)
        for k, r in enumerate(self.readers):
            sharded = r.sharded_layouts  # type: ignore[attr-defined]
            if sharded:  # FSDP1's: `files/sharded_tensor_ranks.py` reads them, never mixed with DTensors
                raise FormatError(f"{self.files[k].name} holds ShardedTensors among DTensor rank files", file=label,
                                  tensor=next(iter(sharded)))
        for name in names:
            layouts: list[ShardLayout | None] = [r.shard_layouts.get(name) for r in self.readers]  # type: ignore[attr-defined]
            locals_ = [r[name] for r in self.readers]
            first = layouts[0]
            if first is None:  # a plain tensor: every rank saved the whole of it, rank 0's is read
                if any(lay is not None for lay in layouts):
                    raise FormatError("a DTensor on some ranks, a plain tensor on others", file=label, tensor=name)
                self.tensors.append(locals_[0])
                continue
            pieces: dict[tuple[tuple[int, ...], tuple[int, ...]], Piece] = {}
            for k, (lay, t) in enumerate(zip(layouts, locals_, strict=True)):
                if lay is None or lay.size != first.size or lay.dtype != first.dtype or lay.mesh != first.mesh \
                        or lay.placements != first.placements:
                    raise FormatError(f"rank {k}'s DTensor disagrees with rank 0's (global shape, dtype, mesh or "
                                      f"placements) in {self.files[k].name}", file=label, tensor=name)
                if lay.rank is not None and lay.rank != k:
                    raise FormatError(f"{self.files[k].name} holds the shards of rank {lay.rank}, not of rank {k}",
                                      file=label, tensor=name)
                mesh_size = 1
                for s in lay.mesh:
                    mesh_size *= s
                if mesh_size != n:
                    raise FormatError(f"the DTensor's mesh {list(lay.mesh)} has {mesh_size} ranks, the files {n}",
                                      file=label, tensor=name)
                offsets, sizes = chunk_of(lay, k, label, name)
                if tuple(t.shape) != sizes:
                    raise FormatError(f"rank {k}'s local tensor is {list(t.shape)} in {self.files[k].name}, its "
                                      f"placements make it {list(sizes)}", file=label, tensor=name)
                pieces.setdefault((offsets, sizes), Piece(offsets, sizes, str(self.files[k]), t))
            dtype = locals_[0].dtype
            self.tensors.append(assemble(name, dtype, first.size, list(pieces.values()), label, self.limits))

    def extra(self) -> dict[str, Any]:
        return {"container": "ranks", "world_size": len(self.files),
                "files": [{"file": str(f), "rank": k} for k, f in enumerate(self.files)]}

    def close(self) -> None:
        if self._first is not None:
            self._first.close()
            self._first = None
        for r in self.readers:
            r.close()
        self.fds.close()

"""Per-rank `torch.save` files of FSDP1 ShardedTensors (SHARDED_STATE_DICT, and the optimizer state
FSDP.optim_state_dict gives under it) read as one checkpoint.

Each rank saved its own state dict, whose values are ShardedTensors: its local shards, plus metadata
listing every rank's shard (offsets, sizes, the rank it is placed on) and the process group it was
saved from. The names (`model_rank0.pt`, Accelerate's `pytorch_model_fsdp_rank0.bin`, any
`...rank<K>...` name: `files.rank_files.any_rank_files`) only propose a set; the files make one when
the lowest rank's holds ShardedTensors (or DTensors, joined by `files.ranks`). The world size is the
saved process group's (else the highest placement's); every rank 0..N-1 must be there exactly once,
each holding the same tensors with the same metadata, and exactly the shards the metadata places on
it. The shards are then assembled as a DCP checkpoint's chunks are (`formats.dcp.assemble`: checked to
tile the tensor, no overlap and no hole, rows streamed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.dtypes import BY_TORCH
from ..core.errors import FormatError, LimitExceededError
from ..core.limits import DEFAULT_LIMITS, Limits
from ..core.reopening import Descriptors, reopening
from ..formats.base import Reader
from ..formats.dcp.assemble import Piece, assemble
from ..formats.pytorch.reader import PytorchReader
from ..formats.pytorch.sharded_tensor import ShardedLayout, local_name
from .rank_files import rank_name, set_pattern
from .ranks import RanksReader


def _open(f: Path, limits: Limits, fds: Descriptors) -> PytorchReader:
    return PytorchReader(reopening(f, fds), limits=limits, dtensor_shards=True)


def open_rank_set(sets: Sequence[Sequence[tuple[int, Path]]], limits: Limits = DEFAULT_LIMITS) -> Reader | None:
    """The set of `...rank<K>...` files among `sets` whose lowest rank's file holds ShardedTensors or
    DTensors, as one reader; None when none does (ordinary files that happen to be named so, opened
    as any other). Of several such sets (a folder's), the first whose name says `model`; else refused,
    asking for a glob."""
    found: list[tuple[Sequence[tuple[int, Path]], PytorchReader]] = []
    fds = Descriptors()  # the chosen set's reader reads every rank through it (`core.reopening`)
    try:
        for ranked in sets:
            first = _open(ranked[0][1], limits, fds)
            if first.sharded_layouts or first.shard_layouts:
                found.append((ranked, first))
            else:
                first.close()
        if len(found) > 1:
            models = [(r, f) for r, f in found if "model" in r[0][1].name]
            if len(models) != 1:
                names = ", ".join(set_pattern(list(r)) for r, _ in found)
                raise FormatError(f"the folder holds the rank files of several checkpoints ({names}); name one with "
                                  "a glob", file=str(found[0][0][0][1].parent))
            found = models + [pair for pair in found if pair is not models[0]]  # the model's first
    except BaseException:
        for _, f in found:
            f.close()
        fds.close()
        raise
    if not found:
        fds.close()
        return None
    for _, f in found[1:]:  # only the chosen set is read
        f.close()
    ranked, first = found[0]
    if first.sharded_layouts:
        return ShardedTensorRanksReader(ranked, limits=limits, first=first, fds=fds)
    layout = next(iter(first.shard_layouts.values()))
    world = 1
    for s in layout.mesh:
        world *= s
    try:
        files = _complete(ranked, world, str(ranked[0][1].parent), limits)
    except BaseException:
        first.close()
        fds.close()
        raise
    return RanksReader(files, limits=limits, first=first, fds=fds)


def _complete(ranked: Sequence[tuple[int, Path]], world: int, label: str, limits: Limits) -> list[Path]:
    """The files of ranks 0..world-1, each once, in rank order: a missing or an extra rank is named."""
    if world > limits.max_shards:
        raise LimitExceededError(f"world size {world}, over the {limits.max_shards} limit (max_shards)", file=label)
    by_rank = dict(ranked)
    extra = [k for k in by_rank if k >= world]
    if extra:
        raise FormatError(f"extra rank file {by_rank[extra[0]].name}: rank {extra[0]} of a world of {world} ranks "
                          f"(0..{world - 1})", file=label)
    missing = [k for k in range(world) if k not in by_rank]
    if missing:
        some = ranked[0][1]
        names = ", ".join(rank_name(some, k) for k in missing[:5])
        raise FormatError(f"rank {missing[0]} of {world} is missing ({names}{' ...' if len(missing) > 5 else ''} "
                          "not found)", file=label)
    return [by_rank[k] for k in range(world)]


def _world(layout: ShardedLayout) -> int:
    if layout.world is not None:
        return layout.world
    return max(s.rank for s in layout.shards) + 1


class ShardedTensorRanksReader(RanksReader):
    """Every rank's file of ShardedTensors as one checkpoint of global tensors (rank 0's order of names)."""

    def __init__(self, ranked: Sequence[tuple[int, Path]], *, limits: Limits = DEFAULT_LIMITS,
                 first: PytorchReader, fds: Descriptors) -> None:
        label = str(ranked[0][1].parent)
        try:
            layout = next(iter(first.sharded_layouts.values()))
            files = _complete(ranked, _world(layout), label, limits)
        except BaseException:
            first.close()
            fds.close()
            raise
        super().__init__(files, limits=limits, first=first, fds=fds)

    def _join(self, label: str) -> None:
        readers: list[PytorchReader] = [r for r in self.readers if isinstance(r, PytorchReader)]
        assert len(readers) == len(self.readers)
        n = len(readers)
        order = readers[0].order or []
        for k, r in enumerate(readers):
            name = self.files[k].name
            if r.shard_layouts:
                raise FormatError(f"{name} holds DTensors beside ShardedTensors", file=label,
                                  tensor=next(iter(r.shard_layouts)))
            if k and set(r.order or []) != set(order):
                extra = sorted(set(r.order or []) ^ set(order))[0]
                where = name if extra in (r.order or []) else self.files[0].name
                raise FormatError(f"rank {k} and rank 0 hold different tensors: '{extra}' is only in {where}",
                                  file=label, tensor=extra)
            for tensor, lay in r.sharded_layouts.items():
                if lay.rank is not None and lay.rank != k:
                    raise FormatError(f"{name} holds the shards of rank {lay.rank}, not of rank {k}", file=label,
                                      tensor=tensor)
                if _world(lay) != n:
                    raise FormatError(f"{name} was saved by a world of {_world(lay)} ranks, the set has {n}",
                                      file=label, tensor=tensor)
        for tensor in order:
            first = readers[0].sharded_layouts.get(tensor)
            if first is None:  # a plain tensor (a step count): every rank saved the whole of it, rank 0's is read
                if any(tensor in r.sharded_layouts for r in readers):
                    raise FormatError("a ShardedTensor on some ranks, a plain tensor on others", file=label,
                                      tensor=tensor)
                self.tensors.append(readers[0][tensor])
                continue
            self.tensors.append(self._assembled(tensor, first, readers, label))

    def _assembled(self, tensor: str, first: ShardedLayout, readers: list[PytorchReader], label: str) -> Any:
        dtype = BY_TORCH.get(first.dtype or "")
        if dtype is None:
            raise FormatError(f"a ShardedTensor of torch dtype {first.dtype}, which migrator does not read",
                              file=label, tensor=tensor)
        pieces: list[Piece] = []
        for k, r in enumerate(readers):
            name = self.files[k].name
            lay = r.sharded_layouts.get(tensor)
            if lay is None or lay.size != first.size or lay.dtype != first.dtype or lay.shards != first.shards:
                raise FormatError(f"rank {k}'s ShardedTensor disagrees with rank 0's (global shape, dtype or shards) "
                                  f"in {name}", file=label, tensor=tensor)
            placed = sorted((s.offsets, s.sizes) for s in first.shards if s.rank == k)
            if sorted((s.offsets, s.sizes) for s in lay.local) != placed or any(s.rank != k for s in lay.local):
                raise FormatError(f"{name} holds shards at offsets {[list(s.offsets) for s in lay.local]}, the "
                                  f"metadata places {[list(o) for o, _ in placed]} on rank {k}", file=label,
                                  tensor=tensor)
            for i, s in enumerate(lay.local):
                pieces.append(Piece(s.offsets, s.sizes, str(self.files[k]), r[local_name(tensor, i)]))
        bad = next((s for s in first.shards if s.rank >= len(readers)), None)
        if bad is not None:
            raise FormatError(f"a shard is placed on rank {bad.rank}, in a world of {len(readers)} ranks",
                              file=label, tensor=tensor)
        return assemble(tensor, dtype, first.size, pieces, label, self.limits)

    def extra(self) -> dict[str, Any]:
        return {**super().extra(), "container": "sharded_tensor_ranks"}

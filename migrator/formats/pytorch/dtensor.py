"""A pickled DTensor's spec read as data: the device mesh's shape, this rank's coordinate on it, and
the placement along each mesh dimension (`Shard(d)`, `Replicate()`, `Partial`, `_StridedShard`).

torch pickles `DTensorSpec` (mesh, placements, tensor_meta) and `DeviceMesh` field by field; the
restricted interpreter keeps them as `Record`s (`safepickle.allowlist.RECORD_CLASSES`). Joining the
ranks' local tensors is `files/ranks.py`'s; this only reads what a spec says, or refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.errors import FormatError
from ..safepickle import values as sp


@dataclass(frozen=True, slots=True)
class Placement:
    """One mesh dimension's placement: "shard" (along `dim`), "replicate", "partial" or "strided_shard"."""

    kind: str
    dim: int = 0
    split_factor: int = 1


@dataclass(frozen=True, slots=True)
class ShardLayout:
    """What a DTensor says of itself: global shape and dtype, mesh shape, this rank's coordinate (None
    when the spec does not say), the placements (one per mesh dimension)."""

    size: tuple[int, ...]
    dtype: str | None
    mesh: tuple[int, ...]
    coordinate: tuple[int, ...] | None
    placements: tuple[Placement, ...]
    rank: int | None = None  # the global rank that saved it, when the mesh says


def _fields(rec: Any) -> dict[str, Any]:
    state = rec.state if isinstance(rec, sp.Record) else None
    if isinstance(state, tuple) and len(state) == 2:
        merged: dict[str, Any] = {}
        for part in state:
            if isinstance(part, dict):
                merged.update(part)
        return merged
    return state if isinstance(state, dict) else {}


def _ints(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, (tuple, list)) and all(type(x) is int and 0 <= x < 1 << 31 for x in v):
        return tuple(v)
    return None


def _placement(rec: Any, label: str, name: str) -> Placement:
    if not isinstance(rec, sp.Record):
        raise FormatError(f"a DTensor placement is {sp.describe(rec)}", file=label, tensor=name)
    short = rec.name.rpartition(".")[2]
    f = _fields(rec)
    if short == "Replicate":
        return Placement("replicate")
    if short == "Partial":
        return Placement("partial")
    dim = f.get("dim")
    if type(dim) is not int or not 0 <= dim < 64:
        raise FormatError(f"a DTensor {short} placement without a dimension", file=label, tensor=name)
    if short == "Shard":
        return Placement("shard", dim)
    if short == "_StridedShard":
        split = f.get("split_factor")
        return Placement("strided_shard", dim, split if type(split) is int and split > 0 else 1)
    raise FormatError(f"unknown DTensor placement {rec.name}", file=label, tensor=name)


def _mesh_shape(mesh: dict[str, Any], ndim: int) -> tuple[int, ...] | None:
    """The mesh's shape: its `mesh` tensor's (older torch) or its layout's (torch >= 2.9)."""
    tensor = mesh.get("mesh")
    if isinstance(tensor, sp.TensorRef) and len(tensor.size) == ndim:
        return tensor.size
    layout = _fields(mesh.get("_layout"))
    axes = layout.get("axes")
    if isinstance(axes, tuple):
        shapes = [_ints(_fields(a).get("shape")) for a in axes]
        if len(shapes) == 1 and shapes[0] is not None and len(shapes[0]) == ndim:
            return shapes[0]
        if len(shapes) == ndim and all(s is not None for s in shapes):
            out = []
            for s in shapes:
                n = 1
                for d in s or ():
                    n *= d
                out.append(n)
            return tuple(out)
    return None


def shard_layout(ref: sp.DTensorRef, label: str, name: str) -> ShardLayout:
    """The layout a pickled DTensor's spec describes (refused, naming the tensor, when unreadable)."""
    spec = _fields(ref.spec)
    raw = spec.get("placements")
    if not isinstance(raw, (tuple, list)) or not raw or len(raw) > 16:
        raise FormatError("a DTensor spec without placements", file=label, tensor=name)
    placements = tuple(_placement(p, label, name) for p in raw)
    mesh = _fields(spec.get("mesh"))
    shape = _mesh_shape(mesh, len(placements))
    if shape is None:
        raise FormatError("a DTensor's device mesh has no shape migrator can read", file=label, tensor=name)
    coordinate = _ints(mesh.get("_coordinate_on_dim"))
    if coordinate is not None and (len(coordinate) != len(shape) or any(
            c >= s for c, s in zip(coordinate, shape, strict=True))):
        coordinate = None
    meta = spec.get("tensor_meta")
    if isinstance(meta, sp.Record) and meta.args:
        # torch gathers by the spec's shape, the wrapper gives the size: a file where they differ
        # is assembled one way here and another (or not at all) by full_tensor()
        claimed = meta.args[0]
        if isinstance(claimed, sp.Record) and claimed.args:  # torch.Size((...)) kept as a call
            claimed = claimed.args[0]
        if isinstance(claimed, (tuple, list)) and tuple(claimed) != tuple(ref.size):
            shown = [x if type(x) is int and x.bit_length() <= 64 else "?" for x in claimed]
            raise FormatError(f"a DTensor's spec says global shape {shown[:8]} but the tensor is "
                              f"{list(ref.size)}", file=label, tensor=name)
    rank = mesh.get("_rank")
    return ShardLayout(ref.size, ref.dtype, shape, coordinate, placements,
                       rank if type(rank) is int and 0 <= rank < 1 << 31 else None)

"""Megatron's stacked axes cut into per-layer tensors, from the DCP chunks (no bytes read to cut).

megatron-core saves a `TransformerBlock`'s layers under one key with a leading `[num_layers, ...]` axis
(`decoder.layers.self_attention.linear_qkv.weight`), and a `SequentialMLP`'s experts under
`decoder.layers.mlp.experts.experts.<param>` with `[num_layers, num_experts, ...]`. One layer (or one
expert of one layer) of a chunk is a contiguous byte range of that chunk, since the stacked axes lead:
each per-layer tensor is assembled from those ranges, as DCP's own tensors are from their chunks.
The vocabulary's padding rows are cut the same way (a range of leading rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from ...core.bytesource import FileView, file_view
from ...core.tensor import LazyTensor
from ..dcp.assemble import Piece


class _Bytes:
    """Bytes [first, first + length) of a tensor that is not one file span (read whole, then cut)."""

    __slots__ = ("first", "length", "tensor")

    def __init__(self, tensor: LazyTensor, first: int, length: int) -> None:
        self.tensor, self.first, self.length = tensor, first, length

    def __call__(self) -> memoryview:
        return self.tensor.data()[self.first:self.first + self.length]


def _range(t: LazyTensor, shape: tuple[int, ...], first: int, length: int) -> LazyTensor:
    """Bytes [first, first + length) of chunk `t`, as a tensor of `shape` (a file span stays one)."""
    loader = t.loader
    if isinstance(loader, FileView) and t.span is loader:
        view = file_view(loader.source, loader.fd, loader.offset + first, length)
        return LazyTensor(t.name, t.dtype, shape, length, view, view, None, t.origin)
    return LazyTensor(t.name, t.dtype, shape, length, _Bytes(t, first, length), None, None, t.origin)


def index(pieces: Sequence[Piece], at: Sequence[int]) -> list[Piece]:
    """The chunks of `tensor[at]` (`at` indexes the leading axes), each a range of a chunk's bytes."""
    k = len(at)
    out = []
    for p in pieces:
        if not all(o <= i < o + s for i, o, s in zip(at, p.offsets, p.sizes, strict=False)):
            continue
        rest = p.sizes[k:]
        inner = prod(rest)
        first = 0
        for j in range(k):
            first = first * p.sizes[j] + (at[j] - p.offsets[j])
        item = p.tensor.dtype.itemsize or 0
        out.append(Piece(p.offsets[k:], rest, p.file, _range(p.tensor, rest, first * inner * item, inner * item)))
    return out


def rows(pieces: Sequence[Piece], stop: int) -> list[Piece]:
    """The chunks of `tensor[:stop]` (the leading rows: a vocabulary without its padding)."""
    out = []
    for p in pieces:
        lo, hi = p.offsets[0], min(p.offsets[0] + p.sizes[0], stop)
        if hi <= lo:
            continue
        if hi == p.offsets[0] + p.sizes[0]:
            out.append(p)
            continue
        inner = prod(p.sizes[1:]) * (p.tensor.dtype.itemsize or 0)
        sizes = (hi - lo, *p.sizes[1:])
        out.append(Piece(p.offsets, sizes, p.file, _range(p.tensor, sizes, 0, (hi - lo) * inner)))
    return out

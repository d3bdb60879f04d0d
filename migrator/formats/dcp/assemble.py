"""One global tensor from the chunks its ranks hold (DCP chunks, DTensor shards), as a lazy tensor.

The chunks must tile the global shape exactly: each inside it, none overlapping another, none
missing; anything else is an error naming the tensor and the files. Chunks that split the tensor
along its first dimension only (FSDP's `Shard(0)`, the common case) are consecutive byte ranges of the
result: they stream straight through, one after another, each read in pieces. Any other layout
(`Shard(1)`, 2-D meshes) is copied into one buffer of that tensor's size when it is asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import prod

from ...core.dtypes import DType
from ...core.errors import FormatError, LimitExceededError
from ...core.limits import DEFAULT_LIMITS, Limits
from ...core.tensor import Buffer, LazyTensor

MAX_PAIRWISE = 4096
"""Chunks of one tensor checked for overlaps pair by pair (more, in a layout other than rows, are refused)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """A chunk with its bytes: its place in the global tensor, the file it is read from, its tensor."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    tensor: LazyTensor


def _check_expansion(name: str, pieces: Sequence[Piece], label: str, limits: Limits) -> None:
    """The single-file reader's bound on strided views (a view may expand its storage window to at most
    `max_expanded_bytes`), applied to the tensor assembled from every rank's chunks: N ranks of 1 GiB
    stride-0 views each are N GiB claimed by a few bytes, which one file alone could not claim."""
    expanded = windows = 0
    for p in pieces:
        window = getattr(p.tensor.loader, "window", None)  # a strided view's storage bytes (`pytorch.views`)
        if type(window) is int:
            expanded += p.tensor.nbytes
            windows += window
    if expanded > max(windows, limits.max_expanded_bytes):
        raise LimitExceededError(f"strided views of {windows} storage bytes in its chunks expand to {expanded} "
                                 f"bytes (limit {limits.max_expanded_bytes}, max_expanded_bytes)", file=label,
                                 tensor=name)


def assemble(name: str, dtype: DType, shape: tuple[int, ...], pieces: Sequence[Piece], label: str,
             limits: Limits = DEFAULT_LIMITS) -> LazyTensor:
    """The global tensor `name` from `pieces` (checked to tile `shape`); `label` names the checkpoint."""
    if not pieces:
        raise FormatError("no chunk holds this tensor", file=label, tensor=name)
    _check_expansion(name, pieces, label, limits)
    for p in pieces:
        if len(p.offsets) != len(shape) or len(p.sizes) != len(shape) or any(
                o + s > d for o, s, d in zip(p.offsets, p.sizes, shape, strict=True)):
            raise FormatError(f"the chunk at offset {list(p.offsets)} of size {list(p.sizes)} (in {p.file}) lies "
                              f"outside the tensor's shape {list(shape)}", file=label, tensor=name)
        if p.tensor.dtype is not dtype or tuple(p.tensor.shape) != p.sizes:
            raise FormatError(f"the chunk at offset {list(p.offsets)} in {p.file} holds a "
                              f"{p.tensor.dtype.display}{list(p.tensor.shape)} tensor, the metadata says "
                              f"{dtype.display}{list(p.sizes)}", file=label, tensor=name)
    nbytes = dtype.nbytes(shape)
    assert nbytes is not None
    live = [p for p in pieces if prod(p.sizes)]
    total = prod(shape)
    rows = all(p.offsets[1:] == (0,) * (len(shape) - 1) and p.sizes[1:] == shape[1:] for p in live) and shape
    if rows:
        live.sort(key=lambda p: p.offsets[0])
        at = 0
        for p in live:
            if p.offsets[0] < at:
                raise _overlap(name, label, p, next(q for q in live if q is not p and _intersect(p, q)))
            if p.offsets[0] > at:
                raise _hole(name, label, f"rows {at}..{p.offsets[0] - 1} are in no chunk")
            at = p.offsets[0] + p.sizes[0]
        if total and at != shape[0]:
            raise _hole(name, label, f"rows {at}..{shape[0] - 1} are in no chunk")
    else:
        if len(live) > MAX_PAIRWISE:
            raise LimitExceededError(f"{len(live)} chunks not split by rows (limit {MAX_PAIRWISE})", file=label,
                                     tensor=name)
        for i, p in enumerate(live):
            for q in live[i + 1:]:
                if _intersect(p, q):
                    raise _overlap(name, label, p, q)
        covered = sum(prod(p.sizes) for p in live)
        if covered != total:
            raise _hole(name, label, f"the chunks cover {covered} of its {total} elements")
    if total == 0:
        return LazyTensor(name, dtype, shape, 0, loader=_empty, origin=label)
    if len(live) == 1:  # the whole tensor in one chunk: that chunk, renamed (a file span stays one)
        return live[0].tensor.renamed(name)
    if rows:
        parts = [p.tensor for p in live]
        return LazyTensor(name, dtype, shape, nbytes, loader=_Joined(parts), origin=label, chunks=_Streamed(parts))
    return LazyTensor(name, dtype, shape, nbytes, loader=_Placed(live, shape, dtype), origin=label)


def _intersect(p: Piece, q: Piece) -> bool:
    return all(a < c + d and c < a + b for a, b, c, d in zip(p.offsets, p.sizes, q.offsets, q.sizes, strict=True))


def _overlap(name: str, label: str, p: Piece, q: Piece) -> FormatError:
    return FormatError(f"chunks overlap: offset {list(p.offsets)} size {list(p.sizes)} (in {p.file}) and offset "
                       f"{list(q.offsets)} size {list(q.sizes)} (in {q.file})", file=label, tensor=name)


def _hole(name: str, label: str, what: str) -> FormatError:
    return FormatError(f"the chunks leave a hole: {what}", file=label, tensor=name)


def _empty() -> bytes:
    return b""


class _Streamed:
    """The bytes of row chunks in order, each in the pieces the streaming writer reads it in."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[LazyTensor]) -> None:
        self.parts = parts

    def __call__(self) -> Iterator[Buffer]:
        from ...core.streaming import computed_pieces

        for t in self.parts:
            yield from computed_pieces(t)


class _Joined:
    """The whole tensor of row chunks, for a caller that wants it at once (numpy, a cast)."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[LazyTensor]) -> None:
        self.parts = parts

    def __call__(self) -> Buffer:
        out = bytearray(sum(t.nbytes for t in self.parts))
        at = 0
        for t in self.parts:
            data = t.data()
            out[at:at + len(data)] = data
            at += len(data)
            data.release()
        return out


class _Placed:
    """Chunks of any layout copied into one buffer of the tensor (one chunk read at a time)."""

    __slots__ = ("dtype", "pieces", "shape")

    def __init__(self, pieces: list[Piece], shape: tuple[int, ...], dtype: DType) -> None:
        self.pieces, self.shape, self.dtype = pieces, shape, dtype

    def __call__(self) -> Buffer:
        import numpy as np

        itemsize = self.dtype.itemsize
        assert itemsize is not None
        out = np.zeros(prod(self.shape) * itemsize, dtype=np.uint8)
        unit = np.dtype((np.void, itemsize))
        whole = out.view(unit).reshape(self.shape)
        for p in self.pieces:
            data = p.tensor.data()
            src = np.frombuffer(data, dtype=unit).reshape(p.sizes)
            whole[tuple(slice(o, o + s) for o, s in zip(p.offsets, p.sizes, strict=True))] = src
            del src
            data.release()
        return memoryview(out.data)

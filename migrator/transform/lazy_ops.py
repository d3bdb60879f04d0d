"""The byte movers of the op graph: every op output is a LazyTensor whose `chunks` stream its bytes.

What holds for each (shapes are checked before any of these is made, by `migrator.transform.ops`):
- reshape makes no copy: the same loader, span and pieces under a new shape;
- a slice along a dim with nothing before it (dim 0, or leading dims of 1) is a contiguous byte range:
  of a stored tensor it is a stored span again (copied in the kernel), else the input's pieces skipped
  and cut; along a later dim, rows are read in bands (pread of only the kept part per row where the
  part is large, of whole rows otherwise) and the kept columns cut out;
- concat (and stack, a concat of inputs with a new dim of 1) streams its inputs one after the other:
  back to back when nothing precedes the dim, else band by band of output rows, each band taking
  its rows from every input in turn;
- rope_permute reorders the rows inside each head's block, head band by head band;
- offset adds a constant band by band, in F32 (F64 for F64), through lazy casts on either side;
- permute [1, 0] of a matrix is the tiled transpose of `casts` (of a dim-0 concat: a dim-1 concat of
  its inputs' transposes); any other permute reads its input as one view (a memory map for a
  stored tensor) and writes bands of the first output dim.
Each reader is sequential, so an input that is itself computed is streamed once per output, never
held whole; peak memory is a few bands plus, for a general permute, the input's map.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from ..core.bytesource import FileView, file_view
from ..core.errors import TensorBytesSizeMismatchError
from ..core.tensor import Buffer, LazyTensor

if TYPE_CHECKING:
    import numpy as np

    from ..core.dtypes import DType

BAND = 4 << 20
"""Target bytes of one streamed piece: well inside the L3 cache, and a few of them fit the memory bound."""
STRIDED_READ = 4 << 10
"""A stored tensor's kept part of a row at least this long is read on its own (a pread per row into the
band); shorter ones come with their whole rows."""


def _prod(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


class SequentialReader:
    """Reads a tensor's bytes front to back: `read(n)` the next n bytes, `skip(n)` past them.

    A stored tensor is read with pread at any offset (a skip costs nothing); any other one is
    consumed from its own pieces (chunks, or slices of its `data()` view)."""

    def __init__(self, tensor: LazyTensor) -> None:
        self.tensor = tensor
        self.pos = 0
        self._pieces: Iterator[memoryview] | None = None
        self._left = memoryview(b"")

    def _next_piece(self, done: int = 0) -> memoryview:
        """The next piece of the tensor's own pieces; `done`: bytes of the current read already gathered."""
        if self._pieces is None:
            from ..core.casts import source_pieces

            self._pieces = (memoryview(p).cast("B") for p in source_pieces(self.tensor, BAND))
        piece = next(self._pieces, None)
        if piece is None:
            raise TensorBytesSizeMismatchError(f"ended after {self.pos + done} of {self.tensor.nbytes} bytes",
                                               file=self.tensor.origin, tensor=self.tensor.name)
        return piece

    def read(self, n: int) -> memoryview:
        t = self.tensor
        if t.span is not None:
            from ..core.streaming import read_span

            out = read_span(t, self.pos, n) if n else memoryview(b"")
            self.pos += n
            return out
        if len(self._left) >= n:
            out, self._left = self._left[:n], self._left[n:]
            self.pos += n
            return out
        buf = bytearray(n)
        done = 0
        while done < n:
            if not self._left:
                self._left = self._next_piece(done)
            k = min(n - done, len(self._left))
            buf[done:done + k] = self._left[:k]
            self._left = self._left[k:]
            done += k
        self.pos += n
        return memoryview(buf)

    def skip(self, n: int) -> None:
        if self.tensor.span is not None:
            self.pos += n
            return
        while n:
            if not self._left:
                self._left = self._next_piece()
            k = min(n, len(self._left))
            self._left = self._left[k:]
            self.pos += k
            n -= k

    def pieces(self, n: int) -> Iterator[memoryview]:
        """The next n bytes as pieces of at most BAND bytes."""
        while n:
            k = min(n, BAND)
            yield self.read(k)
            n -= k


class Gathered:
    """The loader of a streamed output (an op's, a merge's): its pieces gathered into one buffer. A
    writer normally streams the pieces instead; this is for a caller that asks for the whole tensor."""

    __slots__ = ("chunks", "nbytes")

    def __init__(self, chunks: Callable[[], Iterator[Buffer]], nbytes: int) -> None:
        self.chunks, self.nbytes = chunks, nbytes

    def __call__(self) -> memoryview:
        buf = bytearray(self.nbytes)
        done = 0
        for piece in self.chunks():
            k = len(piece)
            buf[done:done + k] = piece
            done += k
        return memoryview(buf)[:done]


class _Chunks:
    """A streamed output's `chunks`: a fresh generator per call (the writer, or its read-ahead thread)."""

    __slots__ = ()

    def __call__(self) -> Iterator[memoryview]:
        raise NotImplementedError


def _made(name: str, like: LazyTensor, shape: tuple[int, ...], chunks: _Chunks,
          param_id: int | None = None) -> LazyTensor:
    nbytes = like.dtype.nbytes(shape)
    assert nbytes is not None  # byte-sized dtypes only (checked when planned)
    return LazyTensor(name, like.dtype, shape, nbytes, Gathered(chunks, nbytes), None, param_id, like.origin, chunks)


def itemsize(t: LazyTensor) -> int:
    size = t.dtype.itemsize
    assert size is not None  # byte-sized dtypes only (checked when planned)
    return size


# -- reshape ----------------------------------------------------------------------------------------------


def reshape(t: LazyTensor, name: str, shape: tuple[int, ...]) -> LazyTensor:
    """The same bytes under another shape: nothing is copied."""
    return LazyTensor(name, t.dtype, shape, t.nbytes, t.loader, t.span, t.param_id if name == t.name else None,
                      t.origin, t.chunks)


# -- slice ------------------------------------------------------------------------------------------------


def slice_(t: LazyTensor, name: str, dim: int, start: int, stop: int) -> LazyTensor:
    """`t[..., start:stop]` along `dim` (0 <= start <= stop <= size)."""
    shape = t.shape
    out_shape = (*shape[:dim], stop - start, *shape[dim + 1:])
    after = _prod(shape[dim + 1:]) * itemsize(t)
    outer = _prod(shape[:dim])
    row = shape[dim] * after
    a, b = start * after, stop * after
    if outer <= 1 or b - a == row:  # one contiguous range (or whole rows)
        first, length = (a, b - a) if outer <= 1 else (0, t.nbytes)
        loader = t.loader
        if isinstance(loader, FileView) and t.span is loader:
            view = file_view(loader.source, loader.fd, loader.offset + first, length)
            return LazyTensor(name, t.dtype, out_shape, length, view, view, None, t.origin)
        return _made(name, t, out_shape, _Range(t, first, length))
    return _made(name, t, out_shape, _Columns(t, outer, row, a, b))


class _Range(_Chunks):
    __slots__ = ("first", "length", "tensor")

    def __init__(self, tensor: LazyTensor, first: int, length: int) -> None:
        self.tensor, self.first, self.length = tensor, first, length

    def __call__(self) -> Iterator[memoryview]:
        r = SequentialReader(self.tensor)
        r.skip(self.first)
        yield from r.pieces(self.length)


class _Columns(_Chunks):
    """Bytes [a, b) of each of `outer` rows of `row` bytes."""

    __slots__ = ("a", "b", "outer", "row", "tensor")

    def __init__(self, tensor: LazyTensor, outer: int, row: int, a: int, b: int) -> None:
        self.tensor, self.outer, self.row, self.a, self.b = tensor, outer, row, a, b

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        t, outer, row, a, b = self.tensor, self.outer, self.row, self.a, self.b
        part = b - a
        span = t.span
        if span is not None and part >= STRIDED_READ and row <= BAND:  # only the parts, a band at a time
            rows = max(1, BAND // part)
            for o in range(0, outer, rows):
                n = min(rows, outer - o)
                band = memoryview(bytearray(n * part))
                for j in range(n):
                    at = span.offset + (o + j) * row + a
                    if os.preadv(span.fd, [band[j * part:(j + 1) * part]], at) != part:
                        raise TensorBytesSizeMismatchError(f"source ended inside row {o + j} of {outer}",
                                                           file=t.origin, tensor=t.name)
                yield band
            return
        r = SequentialReader(t)
        if row > BAND:  # each row's part on its own (a skip of a stored tensor is free)
            for _ in range(outer):
                r.skip(a)
                yield from r.pieces(part)
                r.skip(row - b)
            return
        rows = max(1, BAND // row)  # whole rows, the kept columns cut out
        for o in range(0, outer, rows):
            n = min(rows, outer - o)
            block = np.frombuffer(r.read(n * row), dtype=np.uint8).reshape(n, row)
            yield np.ascontiguousarray(block[:, a:b]).reshape(-1).data


# -- concat / stack ---------------------------------------------------------------------------------------


def concat(inputs: Sequence[LazyTensor], name: str, dim: int, out_shape: tuple[int, ...]) -> LazyTensor:
    """Inputs joined along `dim` (their shapes agree elsewhere; for a stack, each has a 1 at `dim`)."""
    first = inputs[0]
    size = itemsize(first)
    outer = _prod(first.shape[:dim])
    inners = [_prod(t.shape[dim:]) * size for t in inputs]
    return _made(name, first, out_shape, _Joined(list(inputs), outer, inners))


class _Joined(_Chunks):
    __slots__ = ("inners", "inputs", "outer")

    def __init__(self, inputs: list[LazyTensor], outer: int, inners: list[int]) -> None:
        self.inputs, self.outer, self.inners = inputs, outer, inners

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        if self.outer <= 1:  # back to back, one input at a time
            for t in self.inputs:
                yield from SequentialReader(t).pieces(t.nbytes)
            return
        readers = [SequentialReader(t) for t in self.inputs]
        total = sum(self.inners)
        if total > BAND:  # rows too long to band: each input's row in turn
            for _ in range(self.outer):
                for r, inner in zip(readers, self.inners, strict=True):
                    yield from r.pieces(inner)
            return
        rows = max(1, BAND // max(total, 1))
        for o in range(0, self.outer, rows):
            n = min(rows, self.outer - o)
            parts = [np.frombuffer(r.read(n * inner), dtype=np.uint8).reshape(n, inner)
                     for r, inner in zip(readers, self.inners, strict=True)]
            yield np.concatenate(parts, axis=1).reshape(-1).data


# -- rope permutation -------------------------------------------------------------------------------------


def rope_permute(t: LazyTensor, name: str, heads: int, inverse: bool) -> LazyTensor:
    """Within each head's block of rows, Meta's interleaved pairs (row 2i + j) become Hugging Face's halves
    (row j * half + i); `inverse` the other way. Hugging Face's
    `w.view(heads, d1 // heads // 2, 2, d2).transpose(1, 2).reshape(d1, d2)`, one head band at a time."""
    d1 = t.shape[0]
    rowbytes = (t.nbytes // d1) if d1 else 0
    return _made(name, t, t.shape, _Rope(t, heads, d1 // heads // 2 if heads else 0, rowbytes, inverse),
                 t.param_id if name == t.name else None)


class _Rope(_Chunks):
    __slots__ = ("half", "heads", "inverse", "rowbytes", "tensor")

    def __init__(self, tensor: LazyTensor, heads: int, half: int, rowbytes: int, inverse: bool) -> None:
        self.tensor, self.heads, self.half, self.rowbytes, self.inverse = tensor, heads, half, rowbytes, inverse

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        block = 2 * self.half * self.rowbytes
        if not block:
            return
        per_band = max(1, BAND // block)
        r = SequentialReader(self.tensor)
        for h in range(0, self.heads, per_band):
            n = min(per_band, self.heads - h)
            raw = np.frombuffer(r.read(n * block), dtype=np.uint8)
            if self.inverse:
                src = raw.reshape(n, 2, self.half, self.rowbytes)
            else:
                src = raw.reshape(n, self.half, 2, self.rowbytes)
            yield np.ascontiguousarray(src.swapaxes(1, 2)).reshape(-1).data


# -- offset -----------------------------------------------------------------------------------------------


def offset(t: LazyTensor, name: str, value: float, out_dtype: DType) -> LazyTensor:
    """t + value: the input cast to F32 (F64 when the input or output is F64), the constant added there,
    rounded once to `out_dtype`; streamed a band at a time."""
    from ..core import dtypes
    from ..core.casts import cast

    compute = dtypes.F64 if dtypes.F64 in (t.dtype, out_dtype) else dtypes.F32
    wide = cast(t, compute)
    summed = _made(name, wide, t.shape, _Offset(wide, value))
    return cast(summed, out_dtype)


class _Offset(_Chunks):
    __slots__ = ("tensor", "value")

    def __init__(self, tensor: LazyTensor, value: float) -> None:
        self.tensor, self.value = tensor, value

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        kind = np.dtype("<f8" if self.tensor.dtype.itemsize == 8 else "<f4")
        value = np.asarray(self.value, dtype=kind)
        r = SequentialReader(self.tensor)
        for piece in r.pieces(self.tensor.nbytes):
            yield (np.frombuffer(piece, dtype=kind) + value).view(np.uint8).data


# -- permute ----------------------------------------------------------------------------------------------


def permute(t: LazyTensor, name: str, dims: tuple[int, ...]) -> LazyTensor:
    """Dimensions reordered: output dim k is input dim dims[k]."""
    out_shape = tuple(t.shape[d] for d in dims)
    pid = t.param_id if name == t.name else None
    if dims == tuple(range(len(dims))):
        return reshape(t, name, out_shape)
    kept = [d for d in dims if t.shape[d] != 1]  # dims of length 1 move no bytes
    if kept == sorted(kept):
        return reshape(t, name, out_shape)
    joined = t.chunks
    if dims == (1, 0) and isinstance(joined, _Joined) and joined.outer <= 1 \
            and all(len(x.shape) == 2 for x in joined.inputs):
        # the transpose of a row-wise concat is the column-wise concat of the transposes: each input is
        # transposed on its own and streamed, instead of gathering the whole concat first
        parts = [permute(x, x.name, (1, 0)) for x in joined.inputs]
        out = concat(parts, name, 1, out_shape)
        return LazyTensor(name, t.dtype, out_shape, t.nbytes, out.loader, None, pid, t.origin, out.chunks)
    if len(dims) == 2 and t.nbytes:  # a matrix transpose: the tiled, banded kernel (a later cast fuses with it)
        from ..core.casts import transpose2d

        out = transpose2d(t)
        return LazyTensor(name, t.dtype, out_shape, t.nbytes, out.loader, None, pid, t.origin, out.chunks)
    return _made(name, t, out_shape, _Permuted(t, dims), pid)


class _Permuted(_Chunks):
    __slots__ = ("dims", "tensor")

    def __init__(self, tensor: LazyTensor, dims: tuple[int, ...]) -> None:
        self.tensor, self.dims = tensor, dims

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        from ..core.casts import whole

        t = self.tensor
        if not t.nbytes:
            return
        # a map of a stored tensor (or the input's bytes), dropped with the generator
        view = _elements(whole(t), t.shape, itemsize(t))
        view = view.transpose(*self.dims, *range(len(self.dims), view.ndim))
        first = view.shape[0]
        per = max(1, BAND // max(t.nbytes // first, 1))
        for i in range(0, first, per):
            yield np.ascontiguousarray(view[i:i + per]).reshape(-1).view(np.uint8).data


def _elements(raw: memoryview, shape: tuple[int, ...], size: int) -> np.ndarray:
    import numpy as np

    kinds = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
    if size in kinds:
        return np.frombuffer(raw, dtype=kinds[size]).reshape(shape)
    return np.frombuffer(raw, dtype=np.uint8).reshape(*shape, size)



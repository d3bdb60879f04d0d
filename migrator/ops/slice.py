"""`slice`: the range [start, stop) of one dim (tensor[..., start:stop]).

Along a dim with nothing before it (dim 0, or leading dims of 1) the range is contiguous: of a stored
tensor a stored span again (copied in the kernel), else the input's pieces skipped and cut. Along a
later dim, rows are read in bands (a pread of only the kept part per row where the part is large, of
whole rows otherwise) and the kept columns cut out. `split` and `unstack` are slices too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from pydantic import Field

from ..core.bytesource import FileView, file_view
from ..core.errors import TensorBytesSizeMismatchError
from ..core.tensor import LazyTensor
from . import streams
from .base import Failed, Input, Int, Made, Op, Step, UnaryOptions
from .streams import Chunks, SequentialReader, itemsize, made, prod


class SliceSpec(UnaryOptions):
    """The range [start, stop) of `dim` (tensor[..., start:stop])."""

    dim: Int = Field(0, description="Dimension to cut (negative counts from the end).")
    start: Int = Field(0, description="First index kept (negative counts from the end).")
    stop: Int | None = Field(None, description="One past the last index kept (negative counts from the end); "
                             "default: the end.")


class Slice(Op, name="slice"):
    options = SliceSpec
    summary = "Keep a range of one dim of each matching tensor (tensor[..., start:stop])."
    example = r"{slice: {from: 'embed\.weight', dim: 0, start: 0, stop: 32000}}"

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        spec, s = step.spec, inputs[0]
        step.byte_sized(s)
        name, shape = s.name, s.tensor.shape
        d = step.dim(spec.dim, len(shape), name, shape)
        size = shape[d]
        start = spec.start + size if spec.start < 0 else spec.start
        stop = size if spec.stop is None else spec.stop + size if spec.stop < 0 else spec.stop
        if not 0 <= start <= stop <= size:
            step.fail(f"[{spec.start}:{'' if spec.stop is None else spec.stop}] is outside dim {d} of '{name}' "
                      f"(size {size}, shape {list(shape)})", "stop" if stop > size or stop < start else "start")
            raise Failed
        return [(slice_(s.tensor, step.output_name(name), d, start, stop), f"slice dim {d} [{start}:{stop}]")]


def slice_(t: LazyTensor, name: str, dim: int, start: int, stop: int) -> LazyTensor:
    """`t[..., start:stop]` along `dim` (0 <= start <= stop <= size)."""
    shape = t.shape
    out_shape = (*shape[:dim], stop - start, *shape[dim + 1:])
    after = prod(shape[dim + 1:]) * itemsize(t)
    outer = prod(shape[:dim])
    row = shape[dim] * after
    a, b = start * after, stop * after
    if outer <= 1 or b - a == row:  # one contiguous range (or whole rows)
        first, length = (a, b - a) if outer <= 1 else (0, t.nbytes)
        loader = t.loader
        if isinstance(loader, FileView) and t.span is loader:
            view = file_view(loader.source, loader.fd, loader.offset + first, length)
            return LazyTensor(name, t.dtype, out_shape, length, view, view, None, t.origin)
        return made(name, t, out_shape, _Range(t, first, length))
    return made(name, t, out_shape, _Columns(t, outer, row, a, b))


class _Range(Chunks):
    __slots__ = ("first", "length", "tensor")

    def __init__(self, tensor: LazyTensor, first: int, length: int) -> None:
        self.tensor, self.first, self.length = tensor, first, length

    def __call__(self) -> Iterator[memoryview]:
        r = SequentialReader(self.tensor)
        r.skip(self.first)
        yield from r.pieces(self.length)


class _Columns(Chunks):
    """Bytes [a, b) of each of `outer` rows of `row` bytes."""

    __slots__ = ("a", "b", "outer", "row", "tensor")

    def __init__(self, tensor: LazyTensor, outer: int, row: int, a: int, b: int) -> None:
        self.tensor, self.outer, self.row, self.a, self.b = tensor, outer, row, a, b

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        t, outer, row, a, b = self.tensor, self.outer, self.row, self.a, self.b
        part = b - a
        span, band_bytes = t.span, streams.BAND
        if span is not None and part >= streams.STRIDED_READ and row <= band_bytes:  # only the parts, a band at a time
            rows = max(1, band_bytes // part)
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
        if row > band_bytes:  # each row's part on its own (a skip of a stored tensor is free)
            for _ in range(outer):
                r.skip(a)
                yield from r.pieces(part)
                r.skip(row - b)
            return
        rows = max(1, band_bytes // row)  # whole rows, the kept columns cut out
        for o in range(0, outer, rows):
            n = min(rows, outer - o)
            block = np.frombuffer(r.read(n * row), dtype=np.uint8).reshape(n, row)
            yield np.ascontiguousarray(block[:, a:b]).reshape(-1).data

"""`add_rows`: new rows appended along one dim (a vocabulary's new tokens, an expert's router row),
filled with zeros, the mean of the existing rows, or a copy of one of them.

The output is the input followed by a filler, joined as `concat` joins (streamed band by band). The
mean is a pass over the input of its own, before the output's: the sum is kept per row position in
F64 (a row of the dim, never the tensor), the mean rounded to F32 (F64 for an F64 input) and then to
the input's dtype, as `tensor.float().mean(dim)` cast back would be. A training checkpoint's moments of the new rows
are zeros, whatever the fill (`Op.new_rows`): the new rows have no history.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

from pydantic import Field, model_validator

from ..core.tensor import LazyTensor
from . import streams
from .base import Failed, Input, Int, Made, Op, Step, UnaryOptions, problem
from .streams import Chunks, SequentialReader, itemsize, made, prod

MAX_NEW_ROWS = 1 << 24
"""At most this many rows added at once (a header's or a typo's 10**12 would be bytes nobody has)."""


class AddRowsSpec(UnaryOptions):
    """New rows appended along `dim`: `count` of them, or as many as make the dim `size` long."""

    dim: Int = Field(0, description="The dimension that grows (negative counts from the end).")
    count: Int | None = Field(None, description="How many rows are added.")
    size: Int | None = Field(None, description="The dim's size after: as many rows are added as make it so (none "
                             "when it is that size already).")
    fill: Literal["zeros", "mean", "row"] = Field(
        "mean", description="The new rows' values: zeros; the mean of the existing rows (float tensors: summed in "
        "F64, the mean rounded to F32, F64 for an F64 tensor, then to the tensor's dtype, as "
        "tensor.float().mean(dim) cast back); or a copy of row `row`.")
    row: Int | None = Field(None, description="With fill: row, the row copied (negative counts from the end).")

    @model_validator(mode="after")
    def _checks(self) -> AddRowsSpec:
        if (self.count is None) == (self.size is None):
            raise problem("give exactly one of count, size", hint="count: 3 adds three rows")
        for key in ("count", "size"):
            value = getattr(self, key)
            if value is not None and not 0 <= value <= (MAX_NEW_ROWS if key == "count" else 1 << 62):
                raise problem(f"{key} {value} is out of range (0 to {MAX_NEW_ROWS} rows are added at once)", key=key)
        if (self.fill == "row") != (self.row is not None):
            raise problem("row names the row copied by fill: row" if self.row is not None
                          else "fill: row needs row: the index of the row copied", key="row" if self.row else "fill")
        return self


class AddRows(Op, name="add_rows"):
    options = AddRowsSpec
    summary = ("Append rows along one dim of each matching tensor: zeros, the mean of the existing rows, or a copy "
               "of one (new tokens' embeddings; their optimizer moments are zeros).")
    example = r"{add_rows: {from: 'model\.embed_tokens\.weight|lm_head\.weight', dim: 0, count: 2, fill: mean}}"
    new_rows = True

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        spec, s = step.spec, inputs[0]
        step.byte_sized(s)
        t, name, shape = s.tensor, s.name, s.tensor.shape
        d = step.dim(spec.dim, len(shape), name, shape)
        size = shape[d]
        n = spec.count if spec.count is not None else spec.size - size
        if n < 0 or n > MAX_NEW_ROWS:
            step.fail(f"size {spec.size} is {'smaller than' if n < 0 else 'too far beyond'} dim {d} of '{name}' "
                      f"(size {size}, shape {list(shape)}): add_rows only adds rows", "size")
            raise Failed
        fill = spec.fill
        if fill == "mean" and (not t.dtype.is_float or t.dtype.name not in _MEANABLE):
            step.fail(f"'{name}' is {t.dtype.display}: fill: mean takes F64, F32, F16 or BF16 tensors", "fill")
            raise Failed
        if fill in ("mean", "row") and size == 0:
            step.fail(f"'{name}' has no rows along dim {d} (shape {list(shape)}) to take fill: {fill} from", "fill")
            raise Failed
        row = None
        if fill == "row":
            row = spec.row + size if spec.row < 0 else spec.row
            if not 0 <= row < size:
                step.fail(f"row {spec.row} is outside dim {d} of '{name}' (size {size}, shape {list(shape)})", "row")
                raise Failed
        out_name = step.output_name(name)
        text = f"add_rows dim {d}: +{n} ({fill}{'' if row is None else f' of row {row}'})"
        if step.for_state:  # an optimizer's moment: the new rows have no history
            fill, text = "zeros", text + ", zero optimizer state"
        return [(added(t, out_name, d, n, fill, row), text)]


_MEANABLE = ("F64", "F32", "F16", "BF16")


def added(t: LazyTensor, name: str, dim: int, n: int, fill: str, row: int | None = None) -> LazyTensor:
    """`t` with `n` rows appended along `dim`: zeros, the mean of its rows, or copies of `row`."""
    from .concat import concat
    from .slice import slice_

    shape = t.shape
    if n == 0:
        return made(name, t, shape, _Copy(t))
    filler_shape = (*shape[:dim], n, *shape[dim + 1:])
    if fill == "zeros":
        filler = made(f"{name}+", t, filler_shape, Zeros(t.dtype.nbytes(filler_shape) or 0))
    elif fill == "row":
        assert row is not None
        one = slice_(t, f"{name}[{row}]", dim, row, row + 1)
        filler = concat([one] * n, f"{name}+", dim, filler_shape)
    else:
        filler = mean_rows(t, f"{name}+", dim, n)
    return concat([t, filler], name, dim, (*shape[:dim], shape[dim] + n, *shape[dim + 1:]))


def mean_rows(t: LazyTensor, name: str, dim: int, n: int) -> LazyTensor:
    """The mean of `t`'s rows along `dim`, `n` times (shape `t`'s with `n` at `dim`), in `t`'s dtype."""
    from ..core import dtypes
    from ..core.casts import cast

    wide_dtype = dtypes.F64 if t.dtype == dtypes.F64 else dtypes.F32
    wide = cast(t, wide_dtype)
    shape = (*t.shape[:dim], n, *t.shape[dim + 1:])
    mean = made(name, wide, shape, _Mean(wide, prod(t.shape[:dim]), t.shape[dim], prod(t.shape[dim + 1:]), n))
    return cast(mean, t.dtype)


class _Copy(Chunks):
    """The input's bytes under a new tensor (not a view of the same span: a copy is its own tensor)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: LazyTensor) -> None:
        self.tensor = tensor

    def __call__(self) -> Iterator[memoryview]:
        yield from SequentialReader(self.tensor).pieces(self.tensor.nbytes)


class Zeros(Chunks):
    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __call__(self) -> Iterator[memoryview]:
        left = self.nbytes
        while left:
            k = min(left, streams.BAND)
            yield memoryview(bytearray(k))
            left -= k


class _Mean(Chunks):
    """The mean over the middle axis of an (outer, rows, inner) float tensor, each of its `outer` means
    repeated `n` times: one pass over the input per call (the sums are one outer's row long)."""

    __slots__ = ("inner", "n", "outer", "rows", "tensor")

    def __init__(self, tensor: LazyTensor, outer: int, rows: int, inner: int, n: int) -> None:
        self.tensor, self.outer, self.rows, self.inner, self.n = tensor, outer, rows, inner, n

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        size = itemsize(self.tensor)
        kind = np.dtype("<f8" if size == 8 else "<f4")
        r = SequentialReader(self.tensor)
        row = self.inner * size
        band = max(1, streams.BAND // max(row, 1))
        for _ in range(self.outer):
            total = np.zeros(self.inner, dtype=np.float64)
            for start in range(0, self.rows, band):
                k = min(band, self.rows - start)
                total += np.frombuffer(r.read(k * row), dtype=kind).reshape(k, self.inner).sum(
                    axis=0, dtype=np.float64)
            mean = (total / self.rows).astype(kind)
            copies = max(1, streams.BAND // max(row, 1))
            for start in range(0, self.n, copies):
                yield np.tile(mean, min(copies, self.n - start)).view(np.uint8).data

"""`repeat`: each matching tensor repeated along one dim: tiled (torch's `tensor.repeat`: the whole
dim again and again) or each row in turn (`repeat_interleave`: grouped-query attention's key/value
heads made one per query head).

A tile is the input joined to itself (`concat.concat`); an interleave is a tile along a new dim right
after `dim`, reshaped away, so both stream as a concat does. A training checkpoint's moments are
repeated the same way (each copy of a row keeps that row's history).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from ..core.tensor import LazyTensor
from .base import Failed, Input, Int, Made, Op, Step, UnaryOptions, problem

MAX_TIMES = 1 << 16
"""At most this many repeats: every one is an input joined once more."""


class RepeatSpec(UnaryOptions):
    """Each matching tensor repeated `times` along `dim`."""

    dim: Int = Field(0, description="The dimension repeated (negative counts from the end).")
    times: Int = Field(description="How many times the dim's contents appear in the output (>= 1).")
    interleave: bool = Field(False, description="false: the whole dim again and again (tensor.repeat: a b a b); "
                             "true: each row `times` times in turn (repeat_interleave: a a b b).")

    @model_validator(mode="after")
    def _times(self) -> RepeatSpec:
        if not 1 <= self.times <= MAX_TIMES:
            raise problem(f"times {self.times} is out of range (1 to {MAX_TIMES})", key="times")
        return self


class Repeat(Op, name="repeat"):
    options = RepeatSpec
    summary = "Repeat each matching tensor along one dim: tiled (tensor.repeat) or row by row (repeat_interleave)."
    example = r"{repeat: {from: 'model\.layers\.\d+\.self_attn\.[kv]_proj\.weight', dim: 0, times: 2}}"

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        spec, s = step.spec, inputs[0]
        step.byte_sized(s)
        shape = s.tensor.shape
        d = step.dim(spec.dim, len(shape), s.name, shape)
        if not shape:
            step.fail(f"'{s.name}' is a scalar: nothing to repeat", "from")
            raise Failed
        out = repeated(s.tensor, step.output_name(s.name), d, spec.times, spec.interleave)
        return [(out, f"repeat dim {d} x{spec.times}{' interleaved' if spec.interleave else ''}")]


def repeated(t: LazyTensor, name: str, dim: int, times: int, interleave: bool) -> LazyTensor:
    from .concat import concat
    from .reshape import reshape

    shape = t.shape
    out_shape = (*shape[:dim], shape[dim] * times, *shape[dim + 1:])
    if not interleave:
        return concat([t] * times, name, dim, out_shape)
    lifted = reshape(t, t.name, (*shape[:dim + 1], 1, *shape[dim + 1:]))
    each = concat([lifted] * times, name, dim + 1, (*shape[:dim + 1], times, *shape[dim + 1:]))
    return reshape(each, name, out_shape)

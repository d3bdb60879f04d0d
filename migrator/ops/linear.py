"""`linear`: a weighted sum of inputs, sum_i w_i x_i, divided by sum_i w_i when `normalize` (mergekit's
linear), streamed by `compute.arithmetic.linear`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field, model_validator

from .base import F32_MAX, Input, Made, Numbers, Op, Step, problem
from .computing import ComputingSpec, computed


class LinearSpec(ComputingSpec):
    """sum_i w_i x_i, divided by sum_i w_i when `normalize` (mergekit's linear)."""

    weights: Numbers = Field(description="One weight per input, in `from`'s order.")
    normalize: bool = Field(True, description="Divide by the sum of the weights.")
    inputs: ClassVar[tuple[int, int | None]] = (1, None)
    title: ClassVar[str] = "linear"

    @model_validator(mode="after")
    def _weights(self) -> LinearSpec:
        if len(self.weights) != len(self.from_):
            raise problem(f"weights has {len(self.weights)} entries for {len(self.from_)} inputs", key="weights")
        total = math.fsum(self.weights)
        if self.normalize and (total == 0 or abs(total) > F32_MAX):
            raise problem(f"the weights sum to {total:g}: normalize divides by their sum, which would make every "
                          "merged value inf or NaN", key="weights",
                          hint="give weights with a non-zero sum, or set normalize: false")
        return self


class Linear(Op, name="linear"):
    options = LinearSpec
    summary = "A weighted sum of inputs (mergekit's linear)."
    example = r"{linear: {from: ['a\.(.*)', 'b.$1'], to: '$1', weights: [0.5, 0.5]}}"
    joins = computes = True

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        from .compute import arithmetic

        spec = step.spec
        return [computed(step, inputs, lambda name, ts, dtype: (
            arithmetic.linear(name, ts, spec.weights, normalize=spec.normalize, out_dtype=dtype),
            f"linear of {len(ts)}, weights {spec.weights}"))]

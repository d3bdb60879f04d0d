"""`slerp`: spherical interpolation of two inputs (mergekit's slerp), streamed by
`compute.arithmetic.slerp` (its norms and dot product from a first pass)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from .base import Input, Made, Number, Op, Step
from .computing import ComputingSpec, computed


class SlerpSpec(ComputingSpec):
    """Spherical interpolation from the first input (t = 0) to the second (t = 1), mergekit's slerp."""

    t: Number = Field(description="The interpolation factor.")
    inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    title: ClassVar[str] = "slerp"


class Slerp(Op, name="slerp"):
    options = SlerpSpec
    summary = "Spherical interpolation of two inputs (mergekit's slerp)."
    example = r"{slerp: {from: ['a\.(.*)', 'b.$1'], to: '$1', t: 0.3}}"
    joins = computes = True

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        from .compute import arithmetic

        spec = step.spec
        return [computed(step, inputs, lambda name, ts, dtype: (
            arithmetic.slerp(name, ts[0], ts[1], spec.t, out_dtype=dtype), f"slerp t {spec.t}"))]

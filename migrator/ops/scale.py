"""`scale`: each matching tensor times a factor, streamed by `compute.arithmetic.scale`."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from .base import ComputedDType, Input, Made, Number, Op, Options, Pattern, Step, check_template, float_dtype
from .computing import computed


class ScaleSpec(Options):
    """factor x the input."""

    from_: Pattern = Field(alias="from", description="Regex matching whole tensor names; every match is scaled.")
    to: str | None = Field(None, description="Output name, with $1 / ${name} from `from`; default: the input's.")
    factor: Number = Field(description="The factor.")
    dtype: ComputedDType = Field(None, description="Output dtype (F64, F32, F16, BF16); default: the input's.")

    @model_validator(mode="after")
    def _checks(self) -> ScaleSpec:
        if self.to is not None:
            check_template(self.from_, self.to, "to", index_ok=False)
        float_dtype(self.dtype)
        return self


class Scale(Op, name="scale"):
    options = ScaleSpec
    summary = "Each matching tensor times a factor."
    example = r"{scale: {from: 'lm_head\.weight', factor: 0.5}}"
    computes = True

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        from .compute import arithmetic

        spec = step.spec
        return [computed(step, inputs, lambda name, ts, dtype: (
            arithmetic.scale(name, ts[0], spec.factor, out_dtype=dtype), f"scale {spec.factor}"))]

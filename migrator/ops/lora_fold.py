"""`lora_fold`: a LoRA pair folded into its weight, W + scaling x B @ A (PEFT's merge), streamed by
`compute.lora.fold` in torch's summation order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field

from .base import Input, Made, Number, Op, Step
from .computing import ComputingSpec, computed


class LoraFoldSpec(ComputingSpec):
    """W + scaling x B @ A (a LoRA pair folded into its weight), as PEFT's merge."""

    scaling: Number = Field(description="lora_alpha / r (PEFT's; / sqrt(r) with rsLoRA), times any merge scale.")
    form: Literal["linear", "transposed", "conv"] = Field(
        "linear", description="linear: W (out, in); transposed: W stored (in, out) as GPT-2's Conv1D or an "
                              "Embedding; conv: a Conv2d weight (out, in, kh, kw).")
    inputs: ClassVar[tuple[int, int | None]] = (3, 3)
    title: ClassVar[str] = "lora_fold"


class LoraFold(Op, name="lora_fold"):
    options = LoraFoldSpec
    summary = "A LoRA pair folded into its weight: W + s B @ A."
    example = (r"{lora_fold: {from: ['(.*(q_proj|v_proj))\.weight', 'ad.base_model.model.$1.lora_A.weight', "
               r"'ad.base_model.model.$1.lora_B.weight'], scaling: 2.0}}")
    joins = computes = True

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        from .compute import lora

        spec = step.spec
        return [computed(step, inputs, lambda name, ts, dtype: (
            lora.fold(name, ts[0], lora.Fold(ts[1], ts[2], spec.scaling, form=spec.form), out_dtype=dtype),
            f"lora_fold scaling {spec.scaling}"))]

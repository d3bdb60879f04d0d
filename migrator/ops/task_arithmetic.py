"""`task_arithmetic` and its sparsified kin `ties`, `dare_ties`, `dare_linear`: base + lambda x the
weighted sum of the deltas (x_i - base), mergekit's methods, streamed by
`compute.arithmetic.task_arithmetic`. One module: the four take the same keys and differ only in
their defaults (how deltas are sparsified, whether signs are elected, normalize, rescale)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field, model_validator

from .base import Input, Made, Number, Numbers, Op, Step, problem
from .computing import ComputingSpec, computed


class TaskArithmeticSpec(ComputingSpec):
    """base + lambda x the weighted sum of the deltas (x_i - base): mergekit's task_arithmetic; the `ties`,
    `dare_ties` and `dare_linear` ops take the same keys, sparsify the deltas first (by magnitude, or at
    random from `seed`), and ties/dare_ties keep only the terms agreeing with the elected sign."""

    weights: Numbers = Field(description="One weight per model after the base (from[1:]).")
    density: Number | Numbers | None = Field(
        None, description="The fraction of each delta kept (one for all, or one per model); default 1.")
    lambda_: Number = Field(1.0, alias="lambda", description="The factor of the mixed delta.")
    normalize: bool | None = Field(None, description="Divide by the sum of the weights that count; default: true "
                                                     "for ties, false otherwise (as mergekit).")
    rescale: bool | None = Field(None, description="Rescale the kept deltas to the L1 norm of the whole; default: "
                                                   "true for the DARE methods.")
    seed: int | None = Field(None, description="The seed of DARE's random drop (needed with density < 1).")
    inputs: ClassVar[tuple[int, int | None]] = (2, None)
    title: ClassVar[str] = "task arithmetic"

    @model_validator(mode="after")
    def _params(self) -> TaskArithmeticSpec:
        models = len(self.from_) - 1
        if len(self.weights) != models:
            raise problem(f"weights has {len(self.weights)} entries for {models} models after the base",
                          key="weights", hint="from lists the base first, then the models")
        if isinstance(self.density, list) and len(self.density) != models:
            raise problem(f"density has {len(self.density)} entries for {models} models", key="density")
        return self

    def densities(self) -> list[float] | None:
        if self.density is None:
            return None
        return list(self.density) if isinstance(self.density, list) else [self.density] * (len(self.from_) - 1)


class TaskArithmetic(Op, name="task_arithmetic"):
    options = TaskArithmeticSpec
    summary = "A base plus weighted deltas of models (mergekit's task_arithmetic)."
    example = r"{task_arithmetic: {from: ['base\.(.*)', 'a.$1'], to: '$1', weights: [1.0], lambda: 0.8}}"
    joins = computes = True
    sparsify: ClassVar[str | None] = None  # mergekit's defaults when the recipe does not say
    consensus: ClassVar[str | None] = None
    normalize: ClassVar[bool] = False
    rescale: ClassVar[bool] = False

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        from .compute import arithmetic

        spec, kind = step.spec, self.name
        method = arithmetic.DeltaMethod(
            densities=spec.densities(),
            sparsify=self.sparsify,  # type: ignore[arg-type]
            consensus=self.consensus,  # type: ignore[arg-type]
            normalize=self.normalize if spec.normalize is None else spec.normalize, lambda_=spec.lambda_,
            rescale=self.rescale if spec.rescale is None else spec.rescale, seed=spec.seed)
        return [computed(step, inputs, lambda name, ts, dtype: (arithmetic.task_arithmetic(
            name, ts[0], ts[1:], spec.weights, method, out_dtype=dtype),
            f"{kind} of {len(ts)}, weights {spec.weights}"))]


class Ties(TaskArithmetic, name="ties"):
    summary = "TIES: trimmed deltas, sign election, disjoint mean."
    example = r"{ties: {from: ['base\.(.*)', 'a.$1', 'b.$1'], to: '$1', weights: [0.6, 0.4], density: 0.5}}"
    sparsify, consensus, normalize = "magnitude", "sum", True


class DareTies(TaskArithmetic, name="dare_ties"):
    summary = "DARE-TIES: deltas dropped at random, sign election."
    example = (r"{dare_ties: {from: ['base\.(.*)', 'a.$1', 'b.$1'], to: '$1', weights: [1, 1], density: 0.3, "
               r"seed: 7}}")
    sparsify, consensus, rescale = "random", "sum", True


class DareLinear(TaskArithmetic, name="dare_linear"):
    summary = "DARE: deltas dropped at random, summed."
    example = r"{dare_linear: {from: ['base\.(.*)', 'a.$1', 'b.$1'], to: '$1', weights: [1, 1], density: 0.3, seed: 7}}"
    sparsify, rescale = "random", True


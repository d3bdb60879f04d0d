"""The recipe's arithmetic `ops:` entries: weighted sums, scale, SLERP, task arithmetic (TIES, DARE)
and the LoRA fold, each computing one output tensor from the matching tensors of its inputs.

An entry names its inputs as `concat` does with a list: `from: [REGEX, NAME, ...]`, a regex matching
whole (post-remap) names, then the other inputs' names with $1 / ${name} from its groups, e.g.
`from: ['a\\.(.*)', 'b.$1']` over a `sources:` recipe whose entries have the prefixes `a.` and `b.`.
The output takes `to` (default: the first input's name) and `dtype` (default: the first input's).
What can be checked without shapes is checked here (counts of weights and inputs, ranges); shapes,
dtypes and the computation are `transform/merging` (docs/merging.md gives the arithmetic).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, model_validator

from .op_base import Pattern, _Op, _problem, _regex, check_template

MERGE_OP_NAMES = ("linear", "scale", "slerp", "task_arithmetic", "ties", "dare_ties", "dare_linear", "lora_fold")
"""The ops that compute values (the layout ops only move bytes)."""


def _no_bool(value: object) -> object:
    if isinstance(value, bool) or (isinstance(value, list) and any(isinstance(v, bool) for v in value)):
        raise _problem("expected a number, got a boolean")
    return value


F32_MAX = 3.4028234663852886e38
"""The largest float32: merges compute in F32 (F64 only when an input is F64), so a parameter beyond
it would be inf there, and every output value inf or NaN."""


def _finite(value: float) -> float:
    if not math.isfinite(value) or abs(value) > F32_MAX:
        raise _problem(f"expected a finite number (at most {F32_MAX:.4g} in magnitude), got {value!r}: it would "
                       "make every merged value inf or NaN")
    return value


def _all_finite(values: list[float]) -> list[float]:
    for v in values:
        _finite(v)
    return values


Number = Annotated[float, BeforeValidator(_no_bool), AfterValidator(_finite)]
Numbers = Annotated[list[float], BeforeValidator(_no_bool), AfterValidator(_all_finite)]


def _float_dtype(value: str | None) -> str | None:
    if value is None:
        return value
    from ..core.dtypes import parse
    from ..core.errors import UnsupportedDTypeError

    use = "use one of F64, F32, F16, BF16"
    try:
        dtype = parse(value)
    except UnsupportedDTypeError:
        raise _problem(f"unknown dtype '{value}'", key="dtype", hint=use) from None
    if dtype.name not in ("F64", "F32", "F16", "BF16"):
        raise _problem(f"a computed tensor's dtype is a float dtype, got {value}", key="dtype", hint=use)
    return value


ComputedDType = Annotated[str | None, WithJsonSchema({"anyOf": [{"enum": ["F64", "F32", "F16", "BF16"]},
                                                                 {"type": "null"}]})]
"""A computed tensor's dtype (other spellings such as 'bf16' are taken too, as a cast's)."""


class _Computing(_Op):
    from_: list[str] = Field(alias="from", description="A regex matching whole tensor names (after remap and "
                             "filter), then the other inputs' names with $1 / ${name} from its groups, in order.")
    to: str | None = Field(None, description="Output name, with $1 / ${name} from the first pattern's groups; "
                           "default: the first input's name.")
    dtype: ComputedDType = Field(None, description="Output dtype (F64, F32, F16, BF16); default: the first "
                                 "input's. Computed in F32 (F64 when an input is F64), rounded once.")
    inputs: ClassVar[tuple[int, int | None]] = (1, None)  # (fewest, most) entries of `from`

    @model_validator(mode="after")
    def _names(self) -> Any:
        low, high = type(self).inputs
        n = len(self.from_)
        if n < low or (high is not None and n > high):
            want = f"{low}" if low == high else f"at least {low}" if high is None else f"{low} to {high}"
            raise _problem(f"from lists {n} input{'s' if n != 1 else ''}; {self.op_name()} takes {want}", key="from")
        _regex(self.from_[0])
        for name in self.from_[1:]:
            check_template(self.from_[0], name, "from", index_ok=False)
        if self.to is not None:
            check_template(self.from_[0], self.to, "to", index_ok=False)
        _float_dtype(self.dtype)
        return self

    @classmethod
    def op_name(cls) -> str:
        return OP_OF.get(cls.__name__, cls.__name__)


class LinearSpec(_Computing):
    """sum_i w_i x_i, divided by sum_i w_i when `normalize` (mergekit's linear)."""

    weights: Numbers = Field(description="One weight per input, in `from`'s order.")
    normalize: bool = Field(True, description="Divide by the sum of the weights.")
    inputs: ClassVar[tuple[int, int | None]] = (1, None)

    @model_validator(mode="after")
    def _weights(self) -> LinearSpec:
        if len(self.weights) != len(self.from_):
            raise _problem(f"weights has {len(self.weights)} entries for {len(self.from_)} inputs", key="weights")
        total = math.fsum(self.weights)
        if self.normalize and (total == 0 or abs(total) > F32_MAX):
            raise _problem(f"the weights sum to {total:g}: normalize divides by their sum, which would make every "
                           "merged value inf or NaN", key="weights",
                           hint="give weights with a non-zero sum, or set normalize: false")
        return self


class ScaleSpec(_Op):
    """factor x the input."""

    from_: Pattern = Field(alias="from", description="Regex matching whole tensor names; every match is scaled.")
    to: str | None = Field(None, description="Output name, with $1 / ${name} from `from`; default: the input's.")
    factor: Number = Field(description="The factor.")
    dtype: ComputedDType = Field(None, description="Output dtype (F64, F32, F16, BF16); default: the input's.")

    @model_validator(mode="after")
    def _checks(self) -> ScaleSpec:
        if self.to is not None:
            check_template(self.from_, self.to, "to", index_ok=False)
        _float_dtype(self.dtype)
        return self


class SlerpSpec(_Computing):
    """Spherical interpolation from the first input (t = 0) to the second (t = 1), mergekit's slerp."""

    t: Number = Field(description="The interpolation factor.")
    inputs: ClassVar[tuple[int, int | None]] = (2, 2)


class TaskArithmeticSpec(_Computing):
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

    @model_validator(mode="after")
    def _params(self) -> TaskArithmeticSpec:
        models = len(self.from_) - 1
        if len(self.weights) != models:
            raise _problem(f"weights has {len(self.weights)} entries for {models} models after the base",
                           key="weights", hint="from lists the base first, then the models")
        if isinstance(self.density, list) and len(self.density) != models:
            raise _problem(f"density has {len(self.density)} entries for {models} models", key="density")
        return self

    def densities(self) -> list[float] | None:
        if self.density is None:
            return None
        return list(self.density) if isinstance(self.density, list) else [self.density] * (len(self.from_) - 1)


class LoraFoldSpec(_Computing):
    """W + scaling x B @ A (a LoRA pair folded into its weight), as PEFT's merge."""

    scaling: Number = Field(description="lora_alpha / r (PEFT's; / sqrt(r) with rsLoRA), times any merge scale.")
    form: Literal["linear", "transposed", "conv"] = Field(
        "linear", description="linear: W (out, in); transposed: W stored (in, out) as GPT-2's Conv1D or an "
                              "Embedding; conv: a Conv2d weight (out, in, kh, kw).")
    inputs: ClassVar[tuple[int, int | None]] = (3, 3)


OP_OF = {"LinearSpec": "linear", "SlerpSpec": "slerp", "TaskArithmeticSpec": "task arithmetic",
         "LoraFoldSpec": "lora_fold"}

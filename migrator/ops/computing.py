"""What the computed ops share (linear, slerp, the task-arithmetic family, lora_fold; scale takes one
input): `from` as a list naming their inputs, `to`, `dtype`, and how a node's inputs are checked and
its failures placed. The arithmetic itself, streamed band by band, is `compute/` (docs/merging.md).

An entry names its inputs as `concat` does with a list: `from: [REGEX, NAME, ...]`, a regex matching
whole (post-remap) names, then the other inputs' names with $1 / ${name} from its groups, e.g.
`from: ['a\\.(.*)', 'b.$1']` over a `sources:` recipe whose entries have the prefixes `a.` and `b.`.
The output takes `to` (default: the first input's name) and `dtype` (default: the first input's).
What can be checked without shapes is checked by the options (counts of weights and inputs,
ranges); shapes and dtypes when the node is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, model_validator

from .base import ComputedDType, Failed, Input, Made, Options, Step, check_template, float_dtype, problem
from .checks import check_regex

if TYPE_CHECKING:
    from ..core.dtypes import DType
    from ..core.tensor import LazyTensor


class ComputingSpec(Options):
    """What a computed op of several inputs takes."""

    from_: list[str] = Field(alias="from", description="A regex matching whole tensor names (after remap and "
                             "filter), then the other inputs' names with $1 / ${name} from its groups, in order.")
    to: str | None = Field(None, description="Output name, with $1 / ${name} from the first pattern's groups; "
                           "default: the first input's name.")
    dtype: ComputedDType = Field(None, description="Output dtype (F64, F32, F16, BF16); default: the first "
                                 "input's. Computed in F32 (F64 when an input is F64), rounded once.")
    inputs: ClassVar[tuple[int, int | None]] = (1, None)  # (fewest, most) entries of `from`
    title: ClassVar[str] = "this op"  # as a problem with the count of inputs names the op

    @model_validator(mode="after")
    def _names(self) -> Any:
        low, high = type(self).inputs
        n = len(self.from_)
        if n < low or (high is not None and n > high):
            want = f"{low}" if low == high else f"at least {low}" if high is None else f"{low} to {high}"
            raise problem(f"from lists {n} input{'s' if n != 1 else ''}; {self.title} takes {want}", key="from")
        check_regex(self.from_[0])
        for name in self.from_[1:]:
            check_template(self.from_[0], name, "from", index_ok=False)
        if self.to is not None:
            check_template(self.from_[0], self.to, "to", index_ok=False)
        float_dtype(self.dtype)
        return self


Compute = Callable[[str, list["LazyTensor"], "DType | None"], tuple["LazyTensor", str]]
"""(output name, the inputs named as the recipe sees them, the output dtype or None) -> (tensor, ops text)."""


def computed(step: Step, inputs: Sequence[Input], compute: Compute) -> Made:
    """A computed tensor: shapes and dtypes checked now (by `compute`), values when written; a problem
    with an input is the op's, at its `from`."""
    from ..core.dtypes import parse
    from ..core.errors import AdapterError, MergeInputError, UnsupportedDTypeError

    spec = step.spec
    first = inputs[0]
    out_name = step.expand(spec.to, first.name) if spec.to else first.name
    dtype = parse(spec.dtype) if spec.dtype else None
    ts = [s.tensor.renamed(s.name) for s in inputs]  # errors name the tensors as the recipe sees them
    try:
        return compute(out_name, ts, dtype)
    except (MergeInputError, AdapterError, UnsupportedDTypeError) as e:
        step.fail(e.detail if e.tensor is None or e.tensor in e.detail else f"'{e.tensor}': {e.detail}", "from")
        raise Failed from None

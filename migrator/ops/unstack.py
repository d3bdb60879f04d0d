"""`unstack`: one input cut along a dim into its slices, that dim removed (torch.unbind): a slice of
each index, reshaped without the dim (no copy beyond the slice's)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from .base import Failed, Input, Int, Made, Op, Options, Pattern, Step, check_template, has_index_ref, problem
from .split import MAX_PARTS


class UnstackSpec(Options):
    """One input cut along `dim` into its slices, that dim removed (torch.unbind)."""

    from_: Pattern = Field(alias="from", description="Regex matching whole tensor names; every match is unstacked.")
    dim: Int = Field(0, description="Dimension to remove.")
    to: str = Field(description="Output name with $i for the index; $1 / ${name} from `from`.")

    @model_validator(mode="after")
    def _index(self) -> UnstackSpec:
        if not has_index_ref(self.to):
            raise problem("to must use $i: every output would get the same name", key="to",
                          hint="e.g. 'layers.$1.experts.$i.w1.weight'")
        check_template(self.from_, self.to, "to", index_ok=True)
        return self


class Unstack(Op, name="unstack"):
    options = UnstackSpec
    summary = "Cut each matching tensor into its slices along a dim, removing it (torch.unbind)."
    example = r"{unstack: {from: 'layers\.(\d+)\.experts\.w2', dim: 0, to: 'layers.$1.experts.$i.w2.weight'}}"

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        spec, s = step.spec, inputs[0]
        step.byte_sized(s)
        name, shape = s.name, s.tensor.shape
        d = step.dim(spec.dim, len(shape), name, shape)
        if shape[d] > MAX_PARTS:  # a header may declare [2**40, 0]: that many names would exhaust memory
            step.fail(f"unstacking '{name}' (shape {list(shape)}) along dim {d} would make {shape[d]} tensors "
                      f"(at most {MAX_PARTS})", "dim")
            raise Failed
        from .reshape import reshape  # not at import: the registry's order is the package's
        from .slice import slice_

        rest = (*shape[:d], *shape[d + 1:])
        outs: list[Made] = []
        for k in range(shape[d]):
            out_name = step.expand(spec.to, name, k)
            part = slice_(s.tensor, out_name, d, k, k + 1)
            outs.append((reshape(part, out_name, rest), f"unstack dim {d}: index {k}"))
        return outs

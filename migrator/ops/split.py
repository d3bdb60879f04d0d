"""`split`: one input cut along a dim into consecutive parts (torch.split / torch.chunk), each a slice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import Discriminator, Field, Tag, model_validator

from .base import Failed, Input, Int, Ints, Made, Op, Options, Pattern, Step, check_template, has_index_ref, problem

MAX_PARTS = 1 << 16
"""Outputs one `split` or `unstack` may make: a name each, so a count from a recipe (`parts: 2**63`) or
from a header (a dim of [2**40, 0]) must not decide how many are built."""


class SplitSpec(Options):
    """One input cut along `dim` into consecutive parts (torch.split / torch.chunk)."""

    from_: Pattern = Field(alias="from", description="Regex matching whole tensor names; every match is split.")
    dim: Int = Field(0, description="Dimension to cut (negative counts from the end).")
    sizes: Ints | None = Field(None, description="Length of each part along dim; they must add up to its size.")
    parts: Int | None = Field(None, description="Number of equal parts (instead of sizes); must divide the size.")
    to: Annotated[Annotated[str, Tag("name")] | Annotated[list[str], Tag("list")],
                  Discriminator(lambda v: "list" if isinstance(v, list) else "name")] = Field(
        description="A name per part (a list), or one name with $i for the part index; $1 / ${name} from `from`.")

    @model_validator(mode="after")
    def _parts(self) -> SplitSpec:
        if (self.sizes is None) == (self.parts is None):
            raise problem("give exactly one of sizes, parts", hint="sizes: [768, 768, 768] or parts: 3")
        if self.sizes is not None and (not self.sizes or any(s < 0 for s in self.sizes)):
            raise problem("sizes must be a non-empty list of lengths >= 0", key="sizes")
        if self.parts is not None and self.parts < 1:
            raise problem("parts must be at least 1", key="parts")
        if self.parts is not None and self.parts > MAX_PARTS:
            raise problem(f"parts must be at most {MAX_PARTS}", key="parts")
        if self.sizes is not None and len(self.sizes) > MAX_PARTS:
            raise problem(f"sizes may list at most {MAX_PARTS} parts", key="sizes")
        n = len(self.sizes) if self.sizes is not None else self.parts
        if isinstance(self.to, list):
            if len(self.to) != n:
                raise problem(f"to names {len(self.to)} outputs for {n} parts", key="to")
            for t in self.to:
                check_template(self.from_, t, "to", index_ok=True)
        else:
            if not has_index_ref(self.to) and n != 1:
                raise problem(f"one name for {n} parts: every part would get it", key="to",
                              hint="use $i for the part index, or list one name per part")
            check_template(self.from_, self.to, "to", index_ok=True)
        return self


class Split(Op, name="split"):
    options = SplitSpec
    summary = "Cut each matching tensor along a dim into parts (torch.split / torch.chunk)."
    example = (r"{split: {from: 'h\.(\d+)\.attn\.c_attn\.weight', dim: 1, parts: 3, "
               r"to: ['h.$1.attn.q.weight', 'h.$1.attn.k.weight', 'h.$1.attn.v.weight']}}")

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        spec, s = step.spec, inputs[0]
        step.byte_sized(s)
        name, shape = s.name, s.tensor.shape
        d = step.dim(spec.dim, len(shape), name, shape)
        size = shape[d]
        if spec.sizes is not None:
            sizes = list(spec.sizes)
            if sum(sizes) != size:
                step.fail(f"sizes {sizes} add up to {sum(sizes)}, but '{name}' has {size} along dim {d} "
                          f"(shape {list(shape)})", "sizes")
                raise Failed
        else:
            if size % spec.parts:
                step.fail(f"'{name}' has {size} along dim {d} (shape {list(shape)}): not divisible into {spec.parts} "
                          "equal parts", "parts", "give sizes: [...] for unequal parts")
                raise Failed
            if spec.parts > MAX_PARTS:  # checked by the recipe too; a caller may build specs itself
                step.fail(f"split into {spec.parts} parts: at most {MAX_PARTS}", "parts")
                raise Failed
            sizes = [size // spec.parts] * spec.parts
        from .slice import slice_  # not at import: the registry's order is the package's

        outs: list[Made] = []
        start = 0
        for k, n in enumerate(sizes):
            template = spec.to[k] if isinstance(spec.to, list) else spec.to
            out_name = step.expand(template, name, k)
            outs.append((slice_(s.tensor, out_name, d, start, start + n),
                         f"split dim {d}: part {k} of {len(sizes)} [{start}:{start + n}]"))
            start += n
        return outs

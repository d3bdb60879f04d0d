"""`clone`: each matching tensor copied to new names, the input kept beside its copies unless told
otherwise: an `lm_head` untied from the embeddings it shared, a dense MLP upcycled into N experts.

Each copy is its own tensor (its bytes streamed from the input, never the same span), so a writer that
stores tied tensors once stores both. A training checkpoint's moments are copied the same way: each
copy starts from the input's history.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from .base import Input, Int, Made, Op, Options, Pattern, Step, check_template, has_index_ref, problem

MAX_COPIES = 1 << 12


class CloneSpec(Options):
    """Each matching tensor copied to `to` (with `count`: to `count` names, `$i` their index)."""

    from_: Pattern = Field(alias="from", description="Regex matching whole tensor names; every match is copied.")
    to: str = Field(description="The copy's name, with $1 / ${name} from `from`; with count, $i is the copy's index "
                    "(0..count-1).")
    count: Int | None = Field(None, description="How many copies (their names differ by $i); default: one.")
    keep: bool = Field(True, description="Keep the input under its own name beside its copies (false: the copies "
                       "replace it).")

    @model_validator(mode="after")
    def _names(self) -> CloneSpec:
        if self.count is not None:
            if not 1 <= self.count <= MAX_COPIES:
                raise problem(f"count {self.count} is out of range (1 to {MAX_COPIES})", key="count")
            if not has_index_ref(self.to):
                raise problem("with count, to must use $i: every copy would get the same name", key="to",
                              hint="e.g. 'model.layers.$1.block_sparse_moe.experts.$i.w1.weight'")
        check_template(self.from_, self.to, "to", index_ok=self.count is not None)
        return self


class Clone(Op, name="clone"):
    options = CloneSpec
    summary = "Copy each matching tensor to new names, keeping it (untie an lm_head; upcycle an MLP into experts)."
    example = r"{clone: {from: 'model\.embed_tokens\.weight', to: 'lm_head.weight'}}"

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        from .add_rows import added

        spec, s = step.spec, inputs[0]
        step.byte_sized(s)
        outs: list[Made] = [(s.tensor, "clone: kept")] if spec.keep else []
        indices = [None] if spec.count is None else list(range(spec.count))
        for k in indices:
            name = step.expand(spec.to, s.name, k)
            outs.append((added(s.tensor, name, 0, 0, "zeros"), f"clone of {s.name}"))
        return outs

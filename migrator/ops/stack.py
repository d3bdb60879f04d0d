"""`stack`: inputs of one shape joined along a new dim (torch.stack): a concat of the inputs, each
reshaped with a 1 at that dim (`concat.join`)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Input, Made, Op, Step
from .concat import JoiningSpec, join


class StackSpec(JoiningSpec):
    """Inputs of one shape joined along a new `dim` (torch.stack)."""


class Stack(Op, name="stack"):
    options = StackSpec
    summary = "Join inputs of one shape along a new dim (torch.stack)."
    example = (r"{stack: {from: 'layers\.(\d+)\.experts\.(\d+)\.w1\.weight', over: 2, dim: 0, "
               r"to: 'layers.$1.experts.w1'}}")
    joins = True

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        return [join(step, inputs, new_dim=True)]

"""`reshape`: the same elements in a new shape (torch.reshape of a contiguous tensor). No byte moves:
the output is the input's loader, span and pieces under another shape."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from ..core.tensor import LazyTensor
from .base import Failed, Input, Ints, Made, Op, Step, UnaryOptions, problem


class ReshapeSpec(UnaryOptions):
    """The same elements in a new shape (torch.reshape of a contiguous tensor: no byte moves)."""

    shape: Ints = Field(description="New shape; one entry may be -1 (inferred from the element count).")

    @model_validator(mode="after")
    def _shape(self) -> ReshapeSpec:
        if any(d < -1 for d in self.shape) or self.shape.count(-1) > 1:
            raise problem(f"shape {self.shape}: lengths are >= 0, with at most one -1", key="shape")
        return self


def reshape(t: LazyTensor, name: str, shape: tuple[int, ...]) -> LazyTensor:
    """The same bytes under another shape: nothing is copied."""
    return LazyTensor(name, t.dtype, shape, t.nbytes, t.loader, t.span, t.param_id if name == t.name else None,
                      t.origin, t.chunks)


class Reshape(Op, name="reshape"):
    options = ReshapeSpec
    summary = "Give each matching tensor a new shape with the same elements (torch.reshape)."
    example = r"{reshape: {from: 'conv\.weight', shape: [-1, 256]}}"

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        s = inputs[0]
        t = s.tensor
        target = _reshaped(step, s, list(step.spec.shape))
        return [(reshape(t, step.output_name(s.name), target), f"reshape {list(t.shape)} -> {list(target)}")]


def _reshaped(step: Step, s: Input, want: list[int]) -> tuple[int, ...]:
    shape = s.tensor.shape
    numel = 1
    for d in shape:
        numel *= d
    known = 1
    for d in want:
        if d != -1:
            known *= d
    if -1 in want:
        if known == 0 or numel % known:
            step.fail(f"shape {want} cannot hold the {numel} elements of '{s.name}' (shape {list(shape)})", "shape")
            raise Failed
        want = [numel // known if d == -1 else d for d in want]
    elif known != numel:
        step.fail(f"shape {want} has {known} elements, '{s.name}' has {numel} (shape {list(shape)})", "shape")
        raise Failed
    target = tuple(want)
    if s.tensor.dtype.nbytes(target) != s.tensor.nbytes:
        step.fail(f"'{s.name}' is {s.tensor.dtype.display}: packed elements cannot be regrouped as {want}", "shape")
        raise Failed
    return target

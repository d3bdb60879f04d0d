"""`concat`: inputs joined end to end along an existing dim (torch.cat); also what `stack` shares.

The join streams its inputs one after the other: back to back when nothing precedes the dim, else
band by band of output rows, each band taking its rows from every input in turn.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Annotated, Any

from pydantic import BeforeValidator, Discriminator, Field, Tag, model_validator

from ..core.tensor import LazyTensor
from . import streams
from .base import Failed, Input, Int, Made, Op, Options, Step, _no_bool, check_template, problem
from .checks import check_regex
from .streams import Chunks, SequentialReader, itemsize, made, prod

_From = Annotated[Annotated[str, Tag("name")] | Annotated[list[str], Tag("list")],
                  Discriminator(lambda v: "list" if isinstance(v, list) else "name")]


class JoiningSpec(Options):
    """What concat and stack take: their inputs, listed or grouped by an index, and a dim."""

    from_: _From = Field(
        alias="from", description="Either a list: a regex, then the other inputs' names with $1 / ${name} from its "
        "groups (in order); or one regex with `over`: all its matches, ordered by that group's integer value.")
    over: Annotated[int | str, BeforeValidator(_no_bool)] | None = Field(
        None, description="With one regex: the group (number or name) holding the input's index; the matches that "
        "agree on every other group form one output, indices 0..N-1.")
    dim: Int = Field(0, description="Dimension to join along.")
    to: str = Field(description="Output name, with $1 / ${name} from the (first) pattern's groups.")

    @model_validator(mode="after")
    def _inputs(self) -> Any:
        from ..naming import compile_regex

        if isinstance(self.from_, list):
            if self.over is not None:
                raise problem("over needs `from` to be one regex, not a list", key="over")
            if len(self.from_) < 1:
                raise problem("from lists no input", key="from")
            check_regex(self.from_[0])
            for name in self.from_[1:]:
                check_template(self.from_[0], name, "from", index_ok=False)
            pattern = self.from_[0]
        else:
            if self.over is None:
                raise problem("one `from` regex needs `over`: the group holding each input's index",
                              key="from", hint="or list the inputs: from: [REGEX, NAME, ...]")
            check_regex(self.from_)
            pattern = self.from_
            compiled = compile_regex(pattern)
            if isinstance(self.over, int):
                if not 1 <= self.over <= compiled.groups:
                    raise problem(f"over: group {self.over} does not exist; the pattern has {compiled.groups} "
                                  f"group{'' if compiled.groups == 1 else 's'}", key="over")
            elif self.over not in compiled.groupindex:
                raise problem(f"over: the pattern has no group named '{self.over}'", key="over")
        check_template(pattern, self.to, "to", index_ok=False)
        return self


class ConcatSpec(JoiningSpec):
    """Inputs joined end to end along an existing `dim` (torch.cat)."""


class Concat(Op, name="concat"):
    options = ConcatSpec
    summary = "Join inputs end to end along an existing dim (torch.cat)."
    example = (r"{concat: {from: ['layers\.(\d+)\.mlp\.gate\.weight', 'layers.$1.mlp.up.weight'], dim: 0, "
               r"to: 'layers.$1.mlp.gate_up.weight'}}")
    joins = True

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        return [join(step, inputs, new_dim=False)]


def join(step: Step, inputs: Sequence[Input], *, new_dim: bool) -> Made:
    """The inputs joined along `dim`: an existing one (concat), or a new one (`new_dim`: stack)."""
    spec, kind = step.spec, step.kind
    first = inputs[0]
    for s in inputs:
        step.byte_sized(s)
    shape, dtype = first.tensor.shape, first.tensor.dtype
    rank = len(shape)
    d = step.dim(spec.dim, rank, first.name, shape, extra=1 if new_dim else 0)
    bad = [s for s in inputs[1:] if s.tensor.dtype != dtype]
    if bad:
        step.fail(f"{kind} inputs differ in dtype: '{first.name}' is {dtype.display}, '{bad[0].name}' is "
                  f"{bad[0].tensor.dtype.display}", "from")
        raise Failed
    for s in inputs[1:]:
        other = s.tensor.shape
        same = other == shape if new_dim else (
            len(other) == rank and all(a == b for k, (a, b) in enumerate(zip(other, shape, strict=True)) if k != d))
        if not same:
            rule = "equal shapes" if new_dim else f"equal shapes except along dim {d}"
            step.fail(f"{kind} needs {rule}: '{first.name}' is {list(shape)}, '{s.name}' is {list(other)}", "from")
            raise Failed
    parts = [s.tensor for s in inputs]
    if new_dim:
        from .reshape import reshape  # not at import: the registry's order is the package's

        lifted = (*shape[:d], 1, *shape[d:])
        parts = [reshape(p, p.name, lifted) for p in parts]
        out_shape = (*shape[:d], len(inputs), *shape[d:])
    else:
        out_shape = (*shape[:d], sum(s.tensor.shape[d] for s in inputs), *shape[d + 1:])
    return concat(parts, step.expand(spec.to, first.name), d, out_shape), f"{kind} dim {d} of {len(inputs)}"


def concat(inputs: Sequence[LazyTensor], name: str, dim: int, out_shape: tuple[int, ...]) -> LazyTensor:
    """Inputs joined along `dim` (their shapes agree elsewhere; for a stack, each has a 1 at `dim`)."""
    first = inputs[0]
    size = itemsize(first)
    outer = prod(first.shape[:dim])
    inners = [prod(t.shape[dim:]) * size for t in inputs]
    return made(name, first, out_shape, Joined(list(inputs), outer, inners))


class Joined(Chunks):
    """A concat's bytes (a permute of a row-wise concat transposes each input instead: `permute.py`)."""

    __slots__ = ("inners", "inputs", "outer")

    def __init__(self, inputs: list[LazyTensor], outer: int, inners: list[int]) -> None:
        self.inputs, self.outer, self.inners = inputs, outer, inners

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        if self.outer <= 1:  # back to back, one input at a time
            for t in self.inputs:
                yield from SequentialReader(t).pieces(t.nbytes)
            return
        readers = [SequentialReader(t) for t in self.inputs]
        total = sum(self.inners)
        if total > streams.BAND:  # rows too long to band: each input's row in turn
            for _ in range(self.outer):
                for r, inner in zip(readers, self.inners, strict=True):
                    yield from r.pieces(inner)
            return
        rows = max(1, streams.BAND // max(total, 1))
        for o in range(0, self.outer, rows):
            n = min(rows, self.outer - o)
            parts = [np.frombuffer(r.read(n * inner), dtype=np.uint8).reshape(n, inner)
                     for r, inner in zip(readers, self.inners, strict=True)]
            yield np.concatenate(parts, axis=1).reshape(-1).data

"""`new`: a tensor made beside each matching one, of a given shape and the match's dtype: zeros, or
normal values from a seed (a router for experts upcycled from a dense MLP).

The match is only the new tensor's anchor: its name gives `to` its groups (one router per layer), its
dtype the new tensor's; it is kept as it is. A normal fill is numpy's `Generator(PCG64(SeedSequence(
[seed, *words])))`, where `words` are the first 16 bytes of the SHA-256 of the output's name read as
four little-endian uint32: each output has its own stream, the same on every run and machine, whatever
else the recipe makes. The values are `standard_normal(shape)` (float64) times `std`, rounded once to the
dtype, and streamed a band at a time. A training checkpoint's moments of a new tensor are zeros
(`Op.new_rows`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Literal

from pydantic import Field, model_validator

from ..core.tensor import LazyTensor
from . import streams
from .base import Failed, Input, Int, Made, Number, Op, Options, Pattern, Step, check_template, problem
from .streams import Chunks

MAX_ELEMENTS = 1 << 34
"""At most this many elements in a new tensor (a typo's shape would be bytes nobody has)."""


class NewSpec(Options):
    """A tensor of `shape` made beside each match of `from` (kept): zeros, or seeded normal values."""

    from_: Pattern = Field(alias="from", description="Regex matching whole tensor names: each match anchors one new "
                           "tensor (its groups for `to`, its dtype), and is kept.")
    to: str = Field(description="The new tensor's name, with $1 / ${name} from `from`.")
    shape: list[Int] = Field(description="The new tensor's shape (each entry a number or a ${config.KEY} reference).")
    fill: Literal["zeros", "normal"] = Field("zeros", description="zeros, or normal(0, std) values from `seed`.")
    std: Number = Field(0.02, description="With fill: normal, the standard deviation.")
    seed: Int = Field(0, description="With fill: normal, the seed (each output draws its own stream from it and "
                      "its name: deterministic, independent of the recipe's other tensors).")

    @model_validator(mode="after")
    def _checks(self) -> NewSpec:
        check_template(self.from_, self.to, "to", index_ok=False)
        numel = 1
        for d in self.shape:
            if d < 0:
                raise problem(f"shape {self.shape}: lengths are >= 0", key="shape")
            numel *= d
        if numel > MAX_ELEMENTS:
            raise problem(f"shape {self.shape} has {numel} elements (at most {MAX_ELEMENTS})", key="shape")
        if self.seed < 0:
            raise problem(f"seed {self.seed} is negative", key="seed")
        return self


class New(Op, name="new"):
    options = NewSpec
    summary = ("Make a tensor beside each matching one, of a given shape and its dtype: zeros or seeded normal "
               "values (a router for upcycled experts).")
    example = (r"{new: {from: 'model\.layers\.(\d+)\.post_attention_layernorm\.weight', "
               r"to: 'model.layers.$1.block_sparse_moe.gate.weight', shape: [4, 16], fill: zeros}}")
    new_rows = True

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        spec, s = step.spec, inputs[0]
        t = s.tensor
        fill = spec.fill
        if fill == "normal" and (not t.dtype.is_float or t.dtype.name not in ("F64", "F32", "F16", "BF16")):
            step.fail(f"'{s.name}' is {t.dtype.display}: fill: normal makes F64, F32, F16 or BF16 tensors", "fill")
            raise Failed
        step.byte_sized(s)
        name = step.expand(spec.to, s.name)
        text = f"new {list(spec.shape)} {fill}" + (f" std {spec.std:g} seed {spec.seed}" if fill == "normal" else "")
        if step.for_state:  # an optimizer's moment: a new tensor has no history
            fill, text = "zeros", text + ", zero optimizer state"
        return [(t, "new: anchor kept"), (made_tensor(t, name, tuple(spec.shape), fill, spec.std, spec.seed), text)]


def made_tensor(like: LazyTensor, name: str, shape: tuple[int, ...], fill: str, std: float, seed: int) -> LazyTensor:
    from ..core import dtypes
    from ..core.casts import cast
    from .add_rows import Zeros
    from .streams import made

    if fill == "zeros":
        return made(name, like, shape, Zeros(like.dtype.nbytes(shape) or 0))
    from .streams import Gathered

    n = streams.prod(shape)
    chunks = _Normal(n, std, seed, name)
    values = LazyTensor(name, dtypes.F64, shape, 8 * n, Gathered(chunks, 8 * n), None, None, like.origin, chunks)
    return cast(values, like.dtype)


def stream_seed(seed: int, name: str) -> list[int]:
    """The seed sequence's entropy of one output: the seed, then four words of its name's SHA-256."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return [seed, *(int.from_bytes(digest[k:k + 4], "little") for k in range(0, 16, 4))]


class _Normal(Chunks):
    __slots__ = ("n", "name", "seed", "std")

    def __init__(self, n: int, std: float, seed: int, name: str) -> None:
        self.n, self.std, self.seed, self.name = n, std, seed, name

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(stream_seed(self.seed, self.name))))
        per = streams.BAND // 8
        for start in range(0, self.n, per):
            k = min(per, self.n - start)
            yield (rng.standard_normal(k) * self.std).astype("<f8").view(np.uint8).data

"""`rope_permute`: Meta's rotary layout of a q/k projection (interleaved pairs) to Hugging Face's (two
halves per head), the permutation of Hugging Face's Llama conversion script; `inverse` goes back.
The rows inside each head's block are reordered, head band by head band."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pydantic import Field, model_validator

from ..core.tensor import LazyTensor
from . import streams
from .base import Failed, Input, Int, Made, Op, Step, UnaryOptions, problem
from .streams import Chunks, SequentialReader, made


class RopePermuteSpec(UnaryOptions):
    """Meta's rotary layout of a q/k projection (interleaved pairs) to Hugging Face's (two halves per head),
    the permutation of Hugging Face's Llama conversion script; `inverse` goes back."""

    heads: Int = Field(description="Attention heads in this weight (for k: the key/value heads). Take it from the "
                               "model's config: ${config.num_attention_heads}, or for k ${config.num_key_value_heads "
                               "| config.num_attention_heads}.")
    head_dim: Int | None = Field(None, description="Size of one head; each matched tensor must have heads x head_dim "
                                                   "rows. Default: rows / heads, checked against the config's.")
    inverse: bool = Field(False, description="Hugging Face layout -> Meta layout.")

    @model_validator(mode="after")
    def _heads(self) -> RopePermuteSpec:
        if self.heads < 1:
            raise problem("heads must be at least 1", key="heads")
        if self.head_dim is not None and (self.head_dim < 2 or self.head_dim % 2):
            raise problem(f"head_dim {self.head_dim} must be even (rotary pairs) and at least 2", key="head_dim")
        return self


class RopePermute(Op, name="rope_permute"):
    options = RopePermuteSpec
    summary = "Meta's interleaved rotary layout of q/k weights to Hugging Face's, or back (inverse)."
    example = r"{rope_permute: {from: 'layers\.\d+\.attention\.wq\.weight', heads: 32}}"
    reads_head_dim = True  # checked against the head size the model's config declares

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        spec, s = step.spec, inputs[0]
        step.byte_sized(s)
        name, shape = s.name, s.tensor.shape
        rank, heads = len(shape), spec.heads
        if rank not in (1, 2) or shape[0] % (2 * heads):
            step.fail(f"'{name}' (shape {list(shape)}) cannot be cut into {heads} heads of rotary pairs: its first dim "
                      f"must be a multiple of 2 x heads = {2 * heads}" if rank in (1, 2) else
                      f"'{name}' has rank {rank} (shape {list(shape)}); rope_permute takes a weight [out, in] or a "
                      "bias [out]", "heads" if rank in (1, 2) else "from")
            raise Failed
        _check_heads(step, name, shape[0], heads)
        text = f"rope_permute{' inverse' if spec.inverse else ''} heads {heads}"
        return [(rope_permute(s.tensor, step.output_name(name), heads, spec.inverse), text)]


def _check_heads(step: Step, name: str, rows: int, heads: int) -> None:
    """A rope_permute's heads must cut the tensor's rows into heads of the size the recipe's `head_dim`
    and the model's config declare: a head count that merely divides the rows permutes the wrong pairs."""
    per = rows // heads
    given = step.spec.head_dim
    if given is not None and per != given:
        step.fail(f"'{name}' has {rows} rows: {heads} heads x head_dim {given} = {heads * given} do not fit", "heads")
        raise Failed
    if step.head_dim is not None:
        size, how, path = step.head_dim
        if per != size:
            held = f"holds {rows // size} heads" if rows % size == 0 else "is not a whole number of heads"
            meta = "n_heads" in how  # Meta's params.json spells the counts its own way
            q, kv = ("n_heads", "n_kv_heads") if meta else ("num_attention_heads", "num_key_value_heads")
            step.fail(f"heads: {heads} cuts '{name}' ({rows} rows) into heads of {per}, but the config {path} says "
                      f"{how}: this tensor {held}", "heads",
                      f"take the count from the config: heads: ${{config.{q}}}, for k "
                      f"${{config.{kv} | config.{q}}}")
            raise Failed


def rope_permute(t: LazyTensor, name: str, heads: int, inverse: bool) -> LazyTensor:
    """Within each head's block of rows, Meta's interleaved pairs (row 2i + j) become Hugging Face's halves
    (row j * half + i); `inverse` the other way. Hugging Face's
    `w.view(heads, d1 // heads // 2, 2, d2).transpose(1, 2).reshape(d1, d2)`, one head band at a time."""
    d1 = t.shape[0]
    rowbytes = (t.nbytes // d1) if d1 else 0
    return made(name, t, t.shape, _Rope(t, heads, d1 // heads // 2 if heads else 0, rowbytes, inverse),
                t.param_id if name == t.name else None)


class _Rope(Chunks):
    __slots__ = ("half", "heads", "inverse", "rowbytes", "tensor")

    def __init__(self, tensor: LazyTensor, heads: int, half: int, rowbytes: int, inverse: bool) -> None:
        self.tensor, self.heads, self.half, self.rowbytes, self.inverse = tensor, heads, half, rowbytes, inverse

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        block = 2 * self.half * self.rowbytes
        if not block:
            return
        per_band = max(1, streams.BAND // block)
        r = SequentialReader(self.tensor)
        for h in range(0, self.heads, per_band):
            n = min(per_band, self.heads - h)
            raw = np.frombuffer(r.read(n * block), dtype=np.uint8)
            if self.inverse:
                src = raw.reshape(n, 2, self.half, self.rowbytes)
            else:
                src = raw.reshape(n, self.half, 2, self.rowbytes)
            yield np.ascontiguousarray(src.swapaxes(1, 2)).reshape(-1).data

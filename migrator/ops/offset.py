"""`offset`: a constant added to every element (x + value): Gemma's RMSNorm weights, which llama.cpp
stores as weight + 1 (Hugging Face's Gemma multiplies by 1 + weight).

The input is cast to F32 (F64 when the input or output is F64) lazily, the constant added band by
band there, and the sum rounded once to the output dtype."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from .base import ComputedDType, Failed, Input, Made, Number, Op, Step, UnaryOptions, float_dtype
from .streams import Chunks, SequentialReader, made

if TYPE_CHECKING:
    from ..core.dtypes import DType
    from ..core.tensor import LazyTensor


class OffsetSpec(UnaryOptions):
    """A constant added to every element (x + value): Gemma's RMSNorm weights, which llama.cpp stores as
    weight + 1 (Hugging Face's Gemma multiplies by 1 + weight)."""

    value: Number = Field(description="The constant added (1.0, or -1.0 to undo it).")
    dtype: ComputedDType = Field(None, description="Output dtype (F64, F32, F16, BF16); default: the "
                                 "input's. Computed in F32 (F64 when the input or output is F64), "
                                 "rounded once.")

    @model_validator(mode="after")
    def _dtype(self) -> OffsetSpec:
        float_dtype(self.dtype)
        return self


class Offset(Op, name="offset"):
    options = OffsetSpec
    summary = ("Add a constant to every element of each matching float tensor (x + value; Gemma's norms in GGUF "
               "are weight + 1).")
    example = r"{offset: {from: 'model\.layers\.\d+\.\w+_layernorm\.weight', value: 1.0, dtype: F32}}"

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        """x + value, checked now (a float input of a castable dtype), computed when written."""
        from ..core.casts import CASTABLE
        from ..core.dtypes import parse

        spec, s = step.spec, inputs[0]
        t = s.tensor
        if not t.dtype.is_float or t.dtype.name not in CASTABLE:
            step.fail(f"'{s.name}' is {t.dtype.display}: offset adds to F64, F32, F16 or BF16 tensors", "from")
            raise Failed
        out_dtype = parse(spec.dtype) if spec.dtype else t.dtype
        text = f"offset {spec.value:+g}" + (f" -> {out_dtype.name}" if out_dtype != t.dtype else "")
        return [(offset(t, step.output_name(s.name), float(spec.value), out_dtype), text)]


def offset(t: LazyTensor, name: str, value: float, out_dtype: DType) -> LazyTensor:
    """t + value: the input cast to F32 (F64 when the input or output is F64), the constant added there,
    rounded once to `out_dtype`; streamed a band at a time."""
    from ..core import dtypes
    from ..core.casts import cast

    compute = dtypes.F64 if dtypes.F64 in (t.dtype, out_dtype) else dtypes.F32
    wide = cast(t, compute)
    summed = made(name, wide, t.shape, _Offset(wide, value))
    return cast(summed, out_dtype)


class _Offset(Chunks):
    __slots__ = ("tensor", "value")

    def __init__(self, tensor: LazyTensor, value: float) -> None:
        self.tensor, self.value = tensor, value

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        kind = np.dtype("<f8" if self.tensor.dtype.itemsize == 8 else "<f4")
        value = np.asarray(self.value, dtype=kind)
        r = SequentialReader(self.tensor)
        for piece in r.pieces(self.tensor.nbytes):
            yield (np.frombuffer(piece, dtype=kind) + value).view(np.uint8).data

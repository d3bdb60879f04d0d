"""`permute`: dimensions reordered (torch.permute; [1, 0] is a transpose).

A matrix transpose is the tiled, banded transpose of `core.casts` (which a later cast fuses with); the
transpose of a dim-0 concat is the dim-1 concat of its inputs' transposes, so it streams too. Any other
permute reads its input as one view (a memory map for a stored tensor) and writes bands of the first
output dim; one that moves only dims of length 1 is a reshape.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from ..core.tensor import LazyTensor
from . import streams
from .base import Failed, Input, Ints, Made, Op, Step, UnaryOptions, problem
from .concat import Joined, concat
from .reshape import reshape
from .streams import Chunks, itemsize, made

if TYPE_CHECKING:
    import numpy as np


class PermuteSpec(UnaryOptions):
    """Dimensions reordered (torch.permute; [1, 0] is a transpose)."""

    dims: Ints = Field(description="Output dim k is input dim dims[k]: a permutation of 0..rank-1.")

    @model_validator(mode="after")
    def _perm(self) -> PermuteSpec:
        if sorted(self.dims) != list(range(len(self.dims))):
            raise problem(f"dims {self.dims} is not a permutation of 0..{len(self.dims) - 1}", key="dims")
        return self


class Permute(Op, name="permute"):
    options = PermuteSpec
    summary = "Reorder each matching tensor's dims (torch.permute)."
    example = r"{permute: {from: 'h\.\d+\.attn\.[qkv]\.weight', dims: [1, 0]}}"

    def build(self, step: Step, inputs: Sequence[Input]) -> list[Made]:
        s = inputs[0]
        step.byte_sized(s)
        dims, shape = tuple(step.spec.dims), s.tensor.shape
        if len(dims) != len(shape):
            step.fail(f"dims {list(dims)} has {len(dims)} entries, but '{s.name}' has rank {len(shape)} (shape "
                      f"{list(shape)})", "dims")
            raise Failed
        return [(permute(s.tensor, step.output_name(s.name), dims), f"permute {list(dims)}")]


def permute(t: LazyTensor, name: str, dims: tuple[int, ...]) -> LazyTensor:
    """Dimensions reordered: output dim k is input dim dims[k]."""
    out_shape = tuple(t.shape[d] for d in dims)
    pid = t.param_id if name == t.name else None
    if dims == tuple(range(len(dims))):
        return reshape(t, name, out_shape)
    kept = [d for d in dims if t.shape[d] != 1]  # dims of length 1 move no bytes
    if kept == sorted(kept):
        return reshape(t, name, out_shape)
    joined = t.chunks
    if dims == (1, 0) and isinstance(joined, Joined) and joined.outer <= 1 \
            and all(len(x.shape) == 2 for x in joined.inputs):
        # the transpose of a row-wise concat is the column-wise concat of the transposes: each input is
        # transposed on its own and streamed, instead of gathering the whole concat first
        parts = [permute(x, x.name, (1, 0)) for x in joined.inputs]
        out = concat(parts, name, 1, out_shape)
        return LazyTensor(name, t.dtype, out_shape, t.nbytes, out.loader, None, pid, t.origin, out.chunks)
    if len(dims) == 2 and t.nbytes:  # a matrix transpose: the tiled, banded kernel (a later cast fuses with it)
        from ..core.casts import transpose2d

        out = transpose2d(t)
        return LazyTensor(name, t.dtype, out_shape, t.nbytes, out.loader, None, pid, t.origin, out.chunks)
    return made(name, t, out_shape, _Permuted(t, dims), pid)


class _Permuted(Chunks):
    __slots__ = ("dims", "tensor")

    def __init__(self, tensor: LazyTensor, dims: tuple[int, ...]) -> None:
        self.tensor, self.dims = tensor, dims

    def __call__(self) -> Iterator[memoryview]:
        import numpy as np

        from ..core.casts import whole

        t = self.tensor
        if not t.nbytes:
            return
        # a map of a stored tensor (or the input's bytes), dropped with the generator
        view = _elements(whole(t), t.shape, itemsize(t))
        view = view.transpose(*self.dims, *range(len(self.dims), view.ndim))
        first = view.shape[0]
        per = max(1, streams.BAND // max(t.nbytes // first, 1))
        for i in range(0, first, per):
            yield np.ascontiguousarray(view[i:i + per]).reshape(-1).view(np.uint8).data


def _elements(raw: memoryview, shape: tuple[int, ...], size: int) -> np.ndarray:
    import numpy as np

    kinds = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
    if size in kinds:
        return np.frombuffer(raw, dtype=kinds[size]).reshape(shape)
    return np.frombuffer(raw, dtype=np.uint8).reshape(*shape, size)

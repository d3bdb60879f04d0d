"""The LoRA fold as a lazy tensor: W + scaling * (B @ A), band by band of W's rows.

PEFT's `merge_and_unload` computes, per adapted module, in the adapter's dtype (F32 on CPU for F16/BF16
adapters): `delta = (B @ A) * scaling`, transposed for a GPT-2 `Conv1D` (`fan_in_fan_out`) or an
`Embedding`, then `W += delta`. `fold` does the same arithmetic in F32 (F64 for F64 inputs) on one band
of W's rows at a time, multiplying by scaling after the product and adding last, and rounds once to
W's dtype (PEFT rounds an F16/BF16 W once too: the F32 delta is added into it in place). In F32 the
product sums each element's r terms in the order torch's CPU matmul uses for PEFT's `B @ A` of that
shape (lora_product.py: an fma chain for real layer shapes), so the result is PEFT's bit for bit
where that order is known (lora_product.py and docs/merging.md say where it is not).

Layouts (`form`):
- "linear": W (out, in), A (r, in), B (out, r); rows [i, j) of delta are B[i:j] @ A;
- "transposed": W (in, out) of a Conv1D, or an Embedding's (num, dim) with PEFT's
  lora_embedding_A (r, num) and lora_embedding_B (dim, r); delta = (B @ A)^T, rows [i, j) are
  A[:, i:j]^T @ B^T;
- "conv": a Conv2d's W (out, in, kh, kw), A (r, in, kh, kw), B (out, r, 1, 1); delta rows are
  B[i:j] @ A viewed (r, in*kh*kw) (PEFT uses a matmul for 1x1 kernels and a conv for kxk, so a kxk
  fold agrees with it to rounding only).

DoRA (`magnitude`, PEFT's `lora_magnitude_vector` m): V = W + delta, then each output unit scaled by
m / ||V||_2 over its input dimensions. For "linear" and "conv" the output units are W's rows, and a
band holds whole rows; for "transposed" (Conv1D, Embedding) they are W's columns, whose norms need
a first streamed pass over all of W before the output streams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ...core.dtypes import DType
from ...core.errors import AdapterError
from ...core.tensor import LazyTensor
from .bands import Kernel, check_decodable, compute_dtype, computed, elements_per_band, read_bands, whole_values
from .lora_product import scaled_product, torch_order

if TYPE_CHECKING:
    import numpy as np

Form = Literal["linear", "transposed", "conv"]


@dataclass(frozen=True)
class Fold:
    """One adapted weight: its A and B, the scaling and layout, and DoRA's magnitude vector if any."""

    lora_a: LazyTensor
    lora_b: LazyTensor
    scaling: float
    form: Form = "linear"
    magnitude: LazyTensor | None = None


def expected_shape(fold: Fold) -> tuple[int, ...]:
    """The shape W must have for this A and B in this layout (conv: only the first two dims are known)."""
    a, b = fold.lora_a.shape, fold.lora_b.shape
    if fold.form == "linear":
        return (b[0], a[1])
    if fold.form == "transposed":
        return (a[1], b[0])
    return (b[0], *a[1:])


def check_fold(weight: LazyTensor, fold: Fold) -> None:
    """A, B (and m) agree with W's shape and with each other: an error naming all three otherwise."""
    a, b = fold.lora_a, fold.lora_b
    for t in (weight, a, b, *([fold.magnitude] if fold.magnitude is not None else [])):
        check_decodable(t, "a LoRA fold")
    ok_rank = (len(a.shape) >= 2 and len(b.shape) >= 2 and a.shape[0] == b.shape[1]
               and (fold.form == "conv" or (len(a.shape) == 2 and len(b.shape) == 2)))
    if fold.form == "conv":
        ok_rank = ok_rank and len(a.shape) == 4 and len(b.shape) == 4 and b.shape[2:] == (1, 1)
    if not ok_rank or weight.shape != expected_shape(fold):
        raise AdapterError(
            f"LoRA shapes do not fit the base weight {list(weight.shape)} ({fold.form}): "
            f"'{a.name}' {list(a.shape)}, '{b.name}' {list(b.shape)}", file=weight.origin, tensor=weight.name)
    if fold.magnitude is not None:
        units = weight.shape[1] if fold.form == "transposed" else weight.shape[0]
        if fold.magnitude.numel != units:
            raise AdapterError(f"DoRA magnitude '{fold.magnitude.name}' has {fold.magnitude.numel} values, the "
                               f"weight {units} output units", file=weight.origin, tensor=weight.name)


class _Fold(Kernel):
    def __init__(self, weight: LazyTensor, fold: Fold, compute: DType) -> None:
        self.inputs = [weight]
        self.fold = fold
        self.compute = compute
        self.rows = weight.shape[0]
        self.row = weight.numel // self.rows if self.rows else 0
        self.step = elements_per_band([weight], compute, max(1, self.row))
        self.a: np.ndarray | None = None
        self.b: np.ndarray | None = None
        self.column_factor: np.ndarray | None = None
        self.magnitude: np.ndarray | None = None
        self.order = (0, 1)  # torch's summation order for PEFT's product (lora_product.torch_order)

    def _load(self) -> None:
        fold, compute = self.fold, self.compute
        rank = fold.lora_a.shape[0]
        a = whole_values(fold.lora_a, compute).reshape(rank, -1)
        b = whole_values(fold.lora_b, compute).reshape(-1, rank)
        # torch's order depends on the shape of the product PEFT computes: B @ A, [B's rows, A's columns]
        self.order = torch_order(b.shape[0], rank, a.shape[1])
        if fold.form == "transposed":  # rows of delta are columns of B @ A: bands of A^T's rows times B^T
            a, b = b.T.copy(), a.T.copy()  # element (i, j) sums the same products in the same k order
        self.a, self.b = a, b
        if fold.magnitude is not None:
            self.magnitude = whole_values(fold.magnitude, compute)

    def _delta(self, first: int, count: int) -> np.ndarray:
        """Rows [first, first + count) of scaling * delta (as PEFT: the product first, then the scaling)."""
        assert self.a is not None and self.b is not None
        if self.compute.name == "F32":
            return scaled_product(self.b[first:first + count], self.a, *self.order, self.fold.scaling)
        product = self.b[first:first + count] @ self.a  # F64: numpy's order (torch's is not reproduced)
        product *= self.compute.numpy().type(self.fold.scaling)  # in place: the same bits, one array fewer
        return product

    def prepare(self) -> None:
        import numpy as np

        self._load()
        if self.fold.magnitude is None or self.fold.form != "transposed":
            return
        # DoRA on a Conv1D or Embedding: the norms run down W's columns, over every row
        squares = np.zeros(self.row, dtype=np.float64)
        for start, (w,) in read_bands(self.inputs, self.compute, self.step):
            first, count = start // self.row, w.size // self.row
            v = w.reshape(count, self.row) + self._delta(first, count)
            squares += np.einsum("ij,ij->j", v, v, dtype=np.float64)
        assert self.magnitude is not None
        self.column_factor = self.magnitude / np.sqrt(squares).astype(self.compute.numpy())

    def band(self, state: Any, start: int, arrays: list[np.ndarray]) -> np.ndarray:
        import numpy as np

        (w,) = arrays
        if not self.row:
            return w
        first, count = start // self.row, w.size // self.row
        v = self._delta(first, count)
        v += w.reshape(count, self.row)  # W + delta, into the fresh delta: W may be a read-only mapped band
        if self.fold.magnitude is None:
            return v
        if self.column_factor is not None:
            return v * self.column_factor
        assert self.magnitude is not None
        norms = np.linalg.norm(v, axis=1)
        return (self.magnitude[first:first + count] / norms)[:, None] * v


def fold(name: str, weight: LazyTensor, lora: Fold, *, out_dtype: DType | None = None) -> LazyTensor:
    """W with the LoRA delta folded in (and DoRA's rescale), streamed, rounded once to `out_dtype`
    (default: W's dtype). Shapes are checked here, from the headers."""
    check_fold(weight, lora)
    inputs = [weight, lora.lora_a, lora.lora_b] + ([lora.magnitude] if lora.magnitude is not None else [])
    compute = compute_dtype(inputs)
    return computed(name, weight.shape, _Fold(weight, lora, compute), compute,
                    out_dtype if out_dtype is not None else weight.dtype, weight.origin)

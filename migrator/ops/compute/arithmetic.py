"""Element-wise merge arithmetic as lazy tensors: linear, scale, task arithmetic, TIES, DARE, SLERP, passthrough.

Every op checks its inputs' shapes and dtypes from their headers when it is built (nothing is read),
and returns a `LazyTensor` that streams its result band by band (`bands.computed`): inputs decoded to
F32 (F64 when any input is F64), combined, and the result rounded once to the output dtype with
torch's round-to-nearest-even. The formulas are mergekit 0.1.5's (see docs/merging.md):

- `linear`: sum_i w_i x_i, divided by sum_i w_i when `normalize`;
- `task_arithmetic` (also TIES, DARE-TIES, DARE-linear): deltas d_i = x_i - base, each sparsified
  (`magnitude`: the top `density` share of |d_i|; `random`: each element kept with probability
  `density`), optionally rescaled (`rescale`: mergekit's L1 norm ratio, or "density": the DARE
  paper's 1 / density), weighted (w_i d_i), combined
  with an optional sign election (`consensus` sum/count), summed, divided by the summed weights
  of the elected deltas when `normalize`, times `lambda_`, added to base;
- `slerp`: mergekit's spherical interpolation of the whole tensor (linear when nearly colinear);
- `scale` and `passthrough`.

Memory: a band of each input (4 MiB) at a time. SLERP's norms and dot product and DARE's L1 rescale
come from a first streamed pass. TIES's k-th largest magnitude is found exactly by two streamed
histogram passes over the bits of |delta| (`_kth_largest`, with the compiled merge kernels and F32
compute); without them (or in F64) it needs one delta tensor whole (`ndarray.partition`), so that
first pass holds the base tensor and one model's |delta| of that tensor, never the model.

Speed: with the compiled kernels (migrator/core/kernels/merge.c) in F32, SLERP's statistics
(`merge_dot3`), TIES's histograms (`merge_abs_hist`) and the task-arithmetic band
(`merge_task_band`, the numpy code's operations in its order: the same bits) run in C without the
GIL; every pass but DARE's random drop computes its bands on several threads (`bands.over_bands`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ...core.dtypes import DType
from ...core.errors import MergeInputError
from ...core.tensor import LazyTensor
from . import bands
from .bands import Kernel, check_decodable, compute_dtype, computed, elements_per_band, read_bands, whole_values

if TYPE_CHECKING:
    import numpy as np

Sparsify = Literal["magnitude", "random"]
Rescale = Literal["l1", "density"]
Consensus = Literal["sum", "count"]


MERGE_KERNELS = ("merge_dot3", "merge_abs_hist", "merge_linear_band", "merge_task_band")
"""The compiled merge loops; an older build of the kernels without them counts as absent."""


def merge_kernels() -> Any:
    """`migrator.core._kernels` when built with the merge loops (and not switched off), else None."""
    from ...core import casts

    k = casts.kernels
    return k if k is not None and all(hasattr(k, n) for n in MERGE_KERNELS) else None


def check_inputs(op: str, inputs: Sequence[LazyTensor]) -> None:
    """Same shape everywhere and float dtypes: else an error naming every input tensor and its shape."""
    if not inputs:
        raise MergeInputError(f"{op} needs at least one input")
    for t in inputs:
        check_decodable(t, op)
    shapes = {t.shape for t in inputs}
    if len(shapes) > 1:
        listed = ", ".join(f"'{t.name}' ({t.origin or 'memory'}) {list(t.shape)}" for t in inputs)
        raise MergeInputError(f"{op}: inputs disagree in shape: {listed}", tensor=inputs[0].name)


def _out(inputs: Sequence[LazyTensor], out_dtype: DType | None) -> DType:
    return out_dtype if out_dtype is not None else inputs[0].dtype


# -- linear / scale / passthrough --------------------------------------------------------------------------


class _Linear(Kernel):
    def __init__(self, inputs: Sequence[LazyTensor], weights: Sequence[float], normalize: bool,
                 compute: DType) -> None:
        import numpy as np

        self.inputs, self.step = list(inputs), elements_per_band(inputs, compute)
        self.weights = np.asarray(weights, dtype=compute.numpy())
        self.denominator = self.weights.sum() if normalize else None  # in the compute dtype, as mergekit
        self.native = merge_kernels() if compute.name == "F32" and len(self.inputs) <= 64 else None

    def band(self, state: Any, start: int, arrays: list[np.ndarray]) -> np.ndarray:
        if self.native is not None:
            return linear_band(self.native, arrays, [float(w) for w in self.weights],
                               None if self.denominator is None else float(self.denominator))
        out = arrays[0] * self.weights[0]
        for x, w in zip(arrays[1:], self.weights[1:], strict=True):
            out += x * w
        if self.denominator is not None:
            out /= self.denominator
        return out


def linear_band(native: Any, arrays: Sequence[np.ndarray], weights: Sequence[float],
                divisor: float | None) -> np.ndarray:
    """((x_0 w_0 + x_1 w_1) + ...) / divisor (if given) in float32 by the compiled loop: numpy's bits."""
    import numpy as np

    out = np.empty_like(arrays[0])
    native.merge_linear_band(arrays, weights, divisor is not None, 1.0 if divisor is None else divisor, out)
    return out


def linear(name: str, inputs: Sequence[LazyTensor], weights: Sequence[float], *, normalize: bool = True,
           out_dtype: DType | None = None) -> LazyTensor:
    """sum_i weights[i] * inputs[i], divided by sum(weights) when `normalize` (mergekit's `linear`)."""
    check_inputs("linear", inputs)
    if len(weights) != len(inputs):
        raise MergeInputError(f"linear: {len(inputs)} inputs but {len(weights)} weights", tensor=name)
    compute = compute_dtype(inputs)
    return computed(name, inputs[0].shape, _Linear(inputs, weights, normalize, compute), compute,
                    _out(inputs, out_dtype), inputs[0].origin)


def scale(name: str, tensor: LazyTensor, factor: float, *, out_dtype: DType | None = None) -> LazyTensor:
    """factor * tensor, in the compute dtype, rounded once."""
    return linear(name, [tensor], [factor], normalize=False, out_dtype=out_dtype)


def passthrough(name: str, tensor: LazyTensor, *, factor: float | None = None,
                out_dtype: DType | None = None) -> LazyTensor:
    """The tensor itself (renamed, cast to `out_dtype` if given), or `factor` times it (mergekit's `scale`)."""
    from ...core.casts import cast

    if factor is not None:
        return scale(name, tensor, factor, out_dtype=out_dtype)
    out = tensor.renamed(name)
    return cast(out, out_dtype) if out_dtype is not None else out


# -- task arithmetic, TIES, DARE ---------------------------------------------------------------------------


def dare_generator(seed: int, tensor: str, model: int) -> np.random.Generator:
    """The DARE sampler's random stream for one (seed, output tensor name, model index).

    numpy's Philox bit generator keyed by the first 16 bytes (little-endian) of
    SHA-256(f"{seed}\\x00{tensor}\\x00{model}"); the tensor's elements, in C order, draw one
    `Generator.random()` double each, and an element is kept when its draw is < density. The draws
    depend only on the key and the element's position, not on how the tensor is banded."""
    import numpy as np

    digest = hashlib.sha256(f"{seed}\x00{tensor}\x00{model}".encode()).digest()
    return np.random.Generator(np.random.Philox(key=int.from_bytes(digest[:16], "little")))


@dataclass(frozen=True)
class DeltaMethod:
    """How `task_arithmetic` turns the models' deltas into one: the knobs of mergekit's task_arithmetic,
    ties, dare_ties and dare_linear, travelling as one value (the defaults: plain task arithmetic).

    `densities`: the share of each model's delta kept (None: all of every delta); `sparsify`: how the
    rest is dropped (`magnitude`: the smallest |d|; `random`: DARE's draws from `seed`); `consensus`:
    the sign election (sum or count), none without; `normalize`: divide by the summed weights (of the
    elected deltas); `lambda_`: the mixed delta's factor; `rescale` of a sparsified delta: True or "l1"
    is mergekit's (|d|_1 / |kept d|_1, a first pass for a random drop), "density" multiplies the kept
    elements by 1 / density (the DARE paper's)."""

    densities: Sequence[float] | None = None
    sparsify: Sparsify | None = None
    consensus: Consensus | None = None
    normalize: bool = False
    lambda_: float = 1.0
    rescale: bool | Rescale = False
    seed: int | None = None

    @property
    def rescaling(self) -> Rescale | None:
        """`rescale` with True spelled "l1" and False None."""
        return "l1" if self.rescale is True else (self.rescale or None)


class _TaskArithmetic(Kernel):
    def __init__(self, name: str, base: LazyTensor, models: Sequence[LazyTensor], weights: Sequence[float],
                 method: DeltaMethod, compute: DType) -> None:
        import numpy as np

        self.name = name
        self.inputs = [base, *models]
        self.step = elements_per_band(self.inputs, compute)
        self.compute = compute
        self.np_dtype = compute.numpy()
        self.weights = np.asarray(weights, dtype=self.np_dtype)
        n = len(models)
        self.densities = list(method.densities) if method.densities is not None else [1.0] * n
        self.sparsify, self.consensus, self.normalize = method.sparsify, method.consensus, method.normalize
        self.lambda_, self.rescale, self.seed = method.lambda_, method.rescaling, method.seed
        self.thresholds: list[float | None] = [None] * n  # magnitude: keep |d| >= threshold
        self.factors: list[float | None] = [None] * n  # rescale: L1 before / L1 after sparsifying
        self.parallel = method.sparsify != "random"  # DARE's draws are one stream per model, band after band
        self.native = merge_kernels() if compute.name == "F32" and n <= 64 else None

    def _active(self, i: int) -> bool:
        """Whether model i's delta is sparsified at all (density < 1)."""
        return self.sparsify is not None and self.densities[i] < 1

    def prepare(self) -> None:
        import numpy as np

        if self.sparsify is None:
            return
        numel = self.inputs[0].numel
        if self.sparsify == "magnitude":
            base = None
            for i, model in enumerate(self.inputs[1:]):
                density = self.densities[i]
                if density >= 1 or numel == 0:
                    continue
                if density <= 0:
                    self.thresholds[i] = math.inf
                    continue
                k = max(1, int(density * numel))
                sums = self.rescale == "l1"
                if self.native is not None:
                    threshold, total, kept = _kth_largest(self.native, self.inputs[0], model, k, self.step, sums=sums)
                else:
                    if base is None:  # the one whole-tensor step: hold base and one |delta| of this tensor
                        base = whole_values(self.inputs[0], self.compute)
                    threshold, total, kept = _kth_largest_whole(base, model, k, self.compute, sums=sums)
                self.thresholds[i] = threshold
                if sums:
                    self.factors[i] = _l1_factor(total, kept)
            return
        if self.rescale == "density":  # 1 / density, known without a pass
            self.factors = [1 / self.densities[i] if self._active(i) and self.densities[i] > 0 else None
                            for i in range(len(self.inputs) - 1)]
            return
        if self.rescale != "l1" or not any(self._active(i) for i in range(len(self.inputs) - 1)):
            return
        # random drop with L1 rescale: one streamed pass draws the masks to total |d| before and after
        generators = self.begin()
        before = [0.0] * (len(self.inputs) - 1)
        after = [0.0] * (len(self.inputs) - 1)
        for _, arrays in read_bands(self.inputs, self.compute, self.step):
            for i, x in enumerate(arrays[1:]):
                gen = generators[i]
                if gen is None:
                    continue
                magnitude = np.abs(x - arrays[0])
                keep = gen.random(magnitude.size) < self.densities[i]
                before[i] += float(magnitude.sum(dtype=np.float64))
                after[i] += float(magnitude[keep].sum(dtype=np.float64))
        for i, gen in enumerate(generators):
            if gen is not None:
                self.factors[i] = _l1_factor(before[i], after[i])

    def begin(self) -> list[np.random.Generator | None]:
        """DARE's random streams, one per model, at the tensor's first element (none without a random drop)."""
        if self.sparsify != "random":
            return [None] * (len(self.inputs) - 1)
        if self.seed is None:
            raise MergeInputError("a random drop (DARE) needs a seed", tensor=self.name)
        return [dare_generator(self.seed, self.name, i + 1) if self._active(i) else None
                for i in range(len(self.inputs) - 1)]

    def band(self, state: Any, start: int, arrays: list[np.ndarray]) -> np.ndarray:
        import numpy as np

        base = arrays[0]
        if self.native is not None and self.parallel:
            return self._native_band(base, arrays[1:])
        deltas = []
        for i, x in enumerate(arrays[1:]):
            delta = x - base
            if self.sparsify == "magnitude" and self.thresholds[i] is not None:
                delta[np.abs(delta) < self.thresholds[i]] = 0
            elif state[i] is not None:
                delta[state[i].random(delta.size) >= self.densities[i]] = 0
            factor = self.factors[i]
            if factor is not None:
                delta *= self.np_dtype.type(factor)
            delta *= self.weights[i]
            deltas.append(delta)
        if self.consensus is not None:
            if self.consensus == "sum":
                elected = sum(deltas[1:], deltas[0].copy()) >= 0
            else:
                elected = sum((np.sign(d) for d in deltas[1:]), np.sign(deltas[0])) >= 0
            majority = np.where(elected, 1, -1).astype(self.np_dtype)
            mixed = np.zeros_like(base)
            divisor = np.zeros_like(base)
            for d, w in zip(deltas, self.weights, strict=True):
                agrees = np.sign(d) == majority
                mixed += np.where(agrees, d, 0)
                divisor += np.where(agrees, w, 0)
            divisor[divisor == 0] = 1
        else:
            mixed = sum(deltas[1:], deltas[0].copy())
            total = self.weights.sum()
            divisor = total if abs(float(total)) >= 1e-8 else self.np_dtype.type(1)
        if self.normalize:
            mixed /= divisor
        if self.lambda_ != 1:
            mixed *= self.np_dtype.type(self.lambda_)
        return base + mixed


    def _native_band(self, base: np.ndarray, models: list[np.ndarray]) -> np.ndarray:
        """`band` by the compiled loop: the same float32 operations in the same order (a step numpy skips is a
        threshold of NaN, which trims nothing, or a factor of 1)."""
        import numpy as np

        params = [(math.nan if thr is None else thr, 1.0 if f is None else f, float(w))
                  for thr, f, w in zip(self.thresholds, self.factors, self.weights, strict=True)]
        total = self.weights.sum()
        divisor = float(total if abs(float(total)) >= 1e-8 else 1.0)
        consensus = {None: 0, "sum": 1, "count": 2}[self.consensus]
        out = np.empty_like(base)
        assert self.native is not None
        self.native.merge_task_band(base, models, params, consensus, int(self.normalize), divisor,
                                    self.lambda_, out)
        return out


def _kth_largest(native: Any, base: LazyTensor, model: LazyTensor, k: int, step: int,
                 sums: bool = True) -> tuple[float, float, float]:
    """(the k-th largest |model - base| in F32, sum |model - base|, sum of those >= it), both sums in F64
    (a NaN makes the first NaN and is left out of the second, as numpy's sums).

    A non-negative float32 orders as its bits, so two streamed histogram passes find the value exactly
    (the one `np.partition` gives): the top 16 bits' bin holding the k-th largest, then the low 16 bits
    within it. Each band's histogram is its own (bands run on several threads), added in order. Without
    `sums`, both sums are 0 (not computed)."""
    import numpy as np

    from ...core import dtypes

    bins = 1 << 16

    def histogram(prefix: int) -> tuple[np.ndarray, np.ndarray]:
        def one(item: tuple[int, list[np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
            counts, totals = np.zeros(bins, dtype=np.uint64), np.zeros(bins + 1, dtype=np.float64)
            native.merge_abs_hist(item[1][1], item[1][0], counts, totals if sums else None, prefix)
            return counts, totals

        counts, totals = np.zeros(bins, dtype=np.uint64), np.zeros(bins + 1, dtype=np.float64)
        for c, s in bands.over_bands(one, read_bands([base, model], dtypes.F32, step)):
            counts += c
            totals += s
        return counts, totals

    def locate(counts: np.ndarray, want: int) -> tuple[int, int]:
        """(the bin holding the want-th largest, how many lie in the bins above it)."""
        above = np.cumsum(counts[::-1], dtype=np.uint64)[::-1]  # above[b]: elements in bins >= b
        b = int(np.flatnonzero(above >= want)[-1])
        return b, int(above[b] - counts[b])

    high_counts, high_sums = histogram(-1)
    high, above_high = locate(high_counts, k)
    low_counts, low_sums = histogram(high)
    low, _ = locate(low_counts, k - above_high)
    threshold = float(np.array([(high << 16) | low], dtype=np.uint32).view(np.float32)[0])
    # as numpy's sums: a NaN makes the total NaN, and is never >= the threshold
    total = math.nan if high_sums[bins] else float(high_sums[:bins].sum())
    kept = float(high_sums[high + 1:bins].sum() + low_sums[low:bins].sum())
    return threshold, total, kept


def _kth_largest_whole(base: np.ndarray, model: LazyTensor, k: int, compute: DType,
                       sums: bool = True) -> tuple[float, float, float]:
    """`_kth_largest` without the compiled kernels: |model - base| held whole (in place, then partitioned
    in place: two tensors' worth of memory with `base`)."""
    import numpy as np

    magnitude = whole_values(model, compute)
    magnitude -= base
    np.abs(magnitude, out=magnitude)
    numel = magnitude.size
    magnitude.partition(numel - k)
    threshold = float(magnitude[numel - k])
    if not sums:
        return threshold, 0.0, 0.0
    # sums do not depend on the order the partition left
    kept = float(np.sum(magnitude, where=magnitude >= threshold, dtype=np.float64))
    return threshold, float(magnitude.sum(dtype=np.float64)), kept


def _l1_factor(before: float, after: float, eps: float = 1e-7) -> float | None:
    """mergekit's L1 rescale of a sparsified delta: |d|_1 / |masked d|_1, none when either is tiny."""
    if before < eps or after < eps:
        return None
    return before / after


def task_arithmetic(name: str, base: LazyTensor, models: Sequence[LazyTensor], weights: Sequence[float],
                    method: DeltaMethod = DeltaMethod(), *, out_dtype: DType | None = None) -> LazyTensor:
    """base + lambda_ * combine_i(w_i * sparsify(models[i] - base)), as `method` says: mergekit's
    task_arithmetic (no sparsify, no consensus), ties (magnitude + sum), dare_ties (random + sum),
    dare_linear (random)."""
    sparsify, densities = method.sparsify, method.densities
    check_inputs(f"{sparsify}-sparsified merge" if sparsify else "task arithmetic", [base, *models])
    if len(weights) != len(models) or (densities is not None and len(densities) != len(models)):
        raise MergeInputError(f"task arithmetic: {len(models)} models but {len(weights)} weights"
                              f"{'' if densities is None else f' and {len(densities)} densities'}", tensor=name)
    if not models:
        return passthrough(name, base, out_dtype=out_dtype)
    if sparsify == "random" and method.seed is None:
        raise MergeInputError("a random drop (DARE) needs a seed", tensor=name)
    compute = compute_dtype([base, *models])
    kernel = _TaskArithmetic(name, base, models, weights, method, compute)
    return computed(name, base.shape, kernel, compute, _out([base], out_dtype), base.origin)


# -- SLERP -------------------------------------------------------------------------------------------------


class _Slerp(Kernel):
    def __init__(self, a: LazyTensor, b: LazyTensor, t: float, dot_threshold: float, eps: float,
                 compute: DType) -> None:
        self.inputs, self.step = [a, b], elements_per_band([a, b], compute)
        self.t, self.dot_threshold, self.eps, self.compute = t, dot_threshold, eps, compute
        self.coefficients: tuple[float, float] | None = None

    def prepare(self) -> None:
        import numpy as np

        native = merge_kernels() if self.compute.name == "F32" else None

        def sums(item: tuple[int, list[np.ndarray]]) -> tuple[float, float, float]:
            x, y = item[1]
            if native is not None:
                aa, bb, ab = native.merge_dot3(x, y)
                return aa, bb, ab
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            return float(np.dot(x64, x64)), float(np.dot(y64, y64)), float(np.dot(x64, y64))

        aa = bb = ab = 0.0
        for a2, b2, a_b in bands.over_bands(sums, read_bands(self.inputs, self.compute, self.step)):
            aa += a2
            bb += b2
            ab += a_b
        self.coefficients = slerp_coefficients(self.t, math.sqrt(aa), math.sqrt(bb), ab, self.compute,
                                               self.dot_threshold, self.eps)

    def band(self, state: Any, start: int, arrays: list[np.ndarray]) -> np.ndarray:
        assert self.coefficients is not None
        ca, cb = self.coefficients
        dt = arrays[0].dtype.type
        native = merge_kernels() if self.compute.name == "F32" else None
        if native is not None:
            return linear_band(native, arrays, [float(dt(ca)), float(dt(cb))], None)
        return dt(ca) * arrays[0] + dt(cb) * arrays[1]


def slerp_coefficients(t: float, norm_a: float, norm_b: float, dot: float, compute: DType,
                       dot_threshold: float = 0.9995, eps: float = 1e-8) -> tuple[float, float]:
    """mergekit's SLERP weights (c_a, c_b) of the two tensors, the output being c_a a + c_b b.

    Norms at most `eps` count as 1; the cosine is clamped to [-1, 1]; when |cos| > `dot_threshold`
    (colinear or antipodal) the weights are linear (1 - t, t), else sin((1 - t) theta) / sin theta and
    sin(t theta) / sin theta. The trigonometry runs in the compute dtype, as mergekit's does."""
    import numpy as np

    f = compute.numpy().type
    na = norm_a if norm_a > eps else 1.0
    nb = norm_b if norm_b > eps else 1.0
    cos = f(min(1.0, max(-1.0, dot / (na * nb))))
    tt = f(t)
    if abs(cos) > dot_threshold:
        return float(f(1) - tt), float(tt)
    theta = np.arccos(cos)
    sin_theta = np.sin(theta)
    return float(np.sin((f(1) - tt) * theta) / sin_theta), float(np.sin(tt * theta) / sin_theta)


def slerp(name: str, base: LazyTensor, other: LazyTensor, t: float, *, dot_threshold: float = 0.9995,
          eps: float = 1e-8, out_dtype: DType | None = None) -> LazyTensor:
    """Spherical interpolation from `base` (t = 0) to `other` (t = 1) over the whole flattened tensor.

    Needs the tensors' norms and dot product first: a streamed pass over both (two bands held), then
    the output streams."""
    check_inputs("slerp", [base, other])
    compute = compute_dtype([base, other])
    if base.numel == 0:
        return linear(name, [base, other], [1 - t, t], normalize=False, out_dtype=_out([base], out_dtype))
    return computed(name, base.shape, _Slerp(base, other, t, dot_threshold, eps, compute), compute,
                    _out([base], out_dtype), base.origin)

"""The merge loops of migrator/core/kernels/merge.c called directly, against numpy's formulas.

tests/transform/test_merging_kernels.py checks whole merges against the numpy path; these check the
three loops whose result numpy states on its own: the dot products (float64 sums), the weighted sum
of a linear band (float32, the same operations in the same order: the same bits) and the histogram of
|x - base| bit patterns that TIES's magnitude trim walks. Inputs hold NaN, infinities and signed
zeros, and have lengths that are not a multiple of the four-way unrolled loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from migrator.core import native

KERNELS: Any = native.kernels
pytestmark = pytest.mark.skipif(KERNELS is None or not hasattr(KERNELS, "merge_dot3"),
                                reason="the compiled merge kernels are not built")

N = 10_007  # odd: the unrolled loops' tails run too


def awkward(seed: int, n: int = N) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)).astype(np.float32)
    x[rng.choice(n, 30, replace=False)] = 0.0
    x[rng.choice(n, 30, replace=False)] = -0.0
    x[rng.choice(n, 3, replace=False)] = np.nan
    x[rng.choice(n, 2, replace=False)] = np.inf
    x[rng.choice(n, 2, replace=False)] = -np.inf
    return x


def bits(x: np.ndarray) -> list[int]:
    return x.view(np.uint32).tolist()


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, N])
def test_dot3_is_numpy_float64_dot(n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = (rng.standard_normal(n) * 7).astype(np.float32)
    got = KERNELS.merge_dot3(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (float(a64 @ a64), float(b64 @ b64), float(a64 @ b64))
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_dot3_of_non_finite_inputs() -> None:
    a, b = awkward(1), awkward(2)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = [float(a64 @ a64), float(b64 @ b64), float(a64 @ b64)]
    assert all(np.isnan(v) for v in want)
    assert all(np.isnan(v) for v in KERNELS.merge_dot3(a, b))


@pytest.mark.parametrize("divide", [False, True])
@pytest.mark.parametrize("models", [1, 2, 5])
def test_linear_band_has_numpy_float32_bits(models: int, divide: bool) -> None:
    xs = [awkward(10 + i) for i in range(models)]
    weights = [0.3, -1.25, 2.0, 1e-3, 7.5][:models]
    divisor = 3.7
    out = np.empty(N, np.float32)
    KERNELS.merge_linear_band(xs, weights, divide, divisor, out)
    with np.errstate(invalid="ignore", over="ignore"):
        want = xs[0] * np.float32(weights[0])
        for x, w in zip(xs[1:], weights[1:], strict=True):
            want = want + x * np.float32(w)
        if divide:
            want = want / np.float32(divisor)
    assert bits(out) == bits(want.astype(np.float32))


def numpy_hist(x: np.ndarray, base: np.ndarray, prefix: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts per 16-bit bin of |x - base|'s float32 bits (the top half, or the low half of the
    elements whose top half is `prefix`), and the float64 sums of the non-NaN values with NaNs
    counted in one more slot."""
    with np.errstate(invalid="ignore"):
        d = np.abs(x - base)
    u = d.view(np.uint32)
    if prefix < 0:
        keep = np.ones(len(u), bool)
        bins = u >> 16
    else:
        keep = (u >> 16) == prefix
        bins = u & 0xFFFF
    nan = np.isnan(d)
    counts = np.bincount(bins[keep], minlength=65536).astype(np.uint64)
    sums = np.zeros(65537)
    sums[:65536] = np.bincount(bins[keep & ~nan], weights=d[keep & ~nan].astype(np.float64), minlength=65536)
    sums[65536] = np.count_nonzero(keep & nan)
    return counts, sums


def test_abs_hist_top_then_low_bits() -> None:
    x, base = awkward(20), awkward(21)
    base[::50] = x[::50]  # zero differences
    counts = np.zeros(65536, np.uint64)
    sums = np.zeros(65537)
    KERNELS.merge_abs_hist(x, base, counts, sums, -1)
    want_counts, want_sums = numpy_hist(x, base, -1)
    assert counts.tolist() == want_counts.tolist()
    assert sums == pytest.approx(want_sums, rel=1e-12, abs=0)
    assert sums[65536] > 0  # NaN differences were counted apart
    busiest = int(np.argmax(counts[:0x7F80]))  # a bin of finite magnitudes with several elements
    assert counts[busiest] > 1
    low = np.zeros(65536, np.uint64)
    KERNELS.merge_abs_hist(x, base, low, None, busiest)
    assert low.tolist() == numpy_hist(x, base, busiest)[0].tolist()


def test_abs_hist_adds_into_the_callers_bins() -> None:
    x, base = awkward(30), awkward(31)
    counts = np.zeros(65536, np.uint64)
    sums = np.zeros(65537)
    half = N // 2
    KERNELS.merge_abs_hist(x[:half], base[:half], counts, sums, -1)
    KERNELS.merge_abs_hist(x[half:], base[half:], counts, sums, -1)
    want_counts, want_sums = numpy_hist(x, base, -1)
    assert counts.tolist() == want_counts.tolist()
    assert sums == pytest.approx(want_sums, rel=1e-12, abs=0)


def test_bad_buffers_are_refused() -> None:
    a = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="float32"):
        KERNELS.merge_dot3(a, np.zeros(9, np.float32))
    with pytest.raises(ValueError, match="float32"):
        KERNELS.merge_linear_band([a, np.zeros(4, np.float32)], [1.0, 1.0], False, 1.0, np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="one weight each"):
        KERNELS.merge_linear_band([a], [1.0, 2.0], False, 1.0, np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="65536"):
        KERNELS.merge_abs_hist(a, a, np.zeros(10, np.uint64), None, -1)

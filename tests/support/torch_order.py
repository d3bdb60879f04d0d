"""Whether this machine's torch sums a LoRA product in the order migrator reproduces (docs/merging.md,
"Matching PEFT"): an in-order fused multiply-add chain for real layer shapes, a plain in-order sum for
narrow ones. The rule was measured on one CPU and BLAS (torch 2.13's MKL on AMD EPYC); another may
sum in another order, and then no code can give PEFT's bits without calling torch. Tests that compare
migrator's bits with torch's ask this first: where it holds they demand equality, elsewhere they
compare within rounding (and say so), instead of failing on a machine they were not written for.

The probe is independent of migrator: the chain is emulated here in float64 (exact products; the sums
round twice, which these fixed inputs never hit, and a mismatch would only make the tests lenient)."""

from __future__ import annotations

import functools

import numpy as np

LENIENT_ATOL = 1e-6  # within rounding: a few ulps of the delta, far below any real difference


def _chain(b: np.ndarray, a: np.ndarray, fused: bool) -> np.ndarray:
    acc = np.zeros((b.shape[0], a.shape[1]), np.float32)
    for k in range(b.shape[1]):
        product = np.multiply.outer(b[:, k].astype(np.float64), a[k].astype(np.float64))
        acc = (acc.astype(np.float64) + product).astype(np.float32) if fused else acc + product.astype(np.float32)
    return acc + np.float32(0.0)


@functools.lru_cache(maxsize=1)
def torch_sums_in_order() -> bool:
    import torch

    g = np.random.default_rng(2026)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for (m, r, n), fused in (((256, 8, 256), True), ((64, 16, 1024), True), ((16, 2, 8), False)):
            b = (g.standard_normal((m, r)) * 0.1).astype(np.float32)
            a = g.standard_normal((r, n)).astype(np.float32)
            theirs = (torch.from_numpy(b) @ torch.from_numpy(a)).numpy()
            if not np.array_equal(theirs.view(np.uint32), _chain(b, a, fused).view(np.uint32)):
                return False
        return True
    finally:
        torch.set_num_threads(threads)


def exact_or_close(ours: np.ndarray, theirs: np.ndarray, what: str = "") -> None:
    """Bit-equal where torch sums in the stated order, else within LENIENT_ATOL."""
    if torch_sums_in_order():
        assert np.array_equal(ours, theirs), (what, float(np.abs(ours - theirs).max()))
    else:
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=LENIENT_ATOL, err_msg=what)

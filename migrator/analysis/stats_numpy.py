"""`stats.tensor_stats` in numpy: the dtypes the compiled loop does not read (integers, bools, F8),
and every dtype when the kernels are not built. The same figures as the loop, to rounding:
blocks of `moments.BLOCK` elements, their float64 scratch in the L2 cache, merged the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..core.dtypes import Kind
from ..core.tensor import LazyTensor
from .moments import BLOCK, Moments, finish, flags
from .windows import windows


def tensor_stats(tensor: LazyTensor, window: int) -> dict[str, Any]:
    """Stats of a tensor `stats.supported` accepts; `window` a multiple of its item size."""
    blocks = _blocks(tensor, tensor.dtype.numpy(), window)
    if tensor.dtype.kind is Kind.FLOAT:
        return _float_stats(blocks, tensor.numel)
    return _int_stats(blocks, tensor.numel)


def widen(block: np.ndarray) -> np.ndarray:
    """A float block as float32 or float64 values (exactly): F16 through numpy, BF16 by moving its
    bits up (the cheapest exact conversion), F8 through ml_dtypes."""
    if block.dtype == np.float32 or block.dtype == np.float64:
        return block
    if block.dtype.name == "bfloat16":
        return (block.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return block.astype(np.float32)


def _blocks(tensor: LazyTensor, np_dtype: np.dtype, window: int) -> Iterator[np.ndarray]:
    for win in windows(tensor, window):
        arr = np.frombuffer(win, dtype=np_dtype)
        for start in range(0, len(arr), BLOCK):
            yield arr[start:start + BLOCK]


def _add(moments: Moments, x64: np.ndarray, scratch: np.ndarray) -> None:
    """Merge a block of finite float64 values (`scratch`: a buffer at least as long, overwritten)."""
    k = len(x64)
    if k == 0:
        return
    t = scratch[:k]
    mean_b = float(x64.sum()) / k
    np.subtract(x64, mean_b, out=t)
    np.square(t, out=t)  # not np.dot: BLAS may start threads that spin on a busy machine
    m2_b = float(t.sum())
    np.abs(x64, out=t)
    moments.merge(k, mean_b, m2_b, float(t.sum()))


def _float_stats(blocks: Iterator[np.ndarray], numel: int) -> dict[str, Any]:
    moments = Moments()
    lo, hi = math.inf, -math.inf
    zeros = nans = infs = 0
    x64 = np.empty(BLOCK, dtype=np.float64)
    scratch = np.empty(BLOCK, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for raw in blocks:
            x = widen(raw)
            k = len(x)
            zeros += k - int(np.count_nonzero(x))
            b_lo, b_hi = x.min(), x.max()  # NaN or inf in the block shows in one of these
            if not (math.isfinite(b_lo) and math.isfinite(b_hi)):
                nan_mask = np.isnan(x)
                inf_mask = np.isinf(x)
                nans += int(np.count_nonzero(nan_mask))
                infs += int(np.count_nonzero(inf_mask))
                x = x[~(nan_mask | inf_mask)]
                k = len(x)
                if k == 0:
                    continue
                b_lo, b_hi = x.min(), x.max()
            lo, hi = min(lo, float(b_lo)), max(hi, float(b_hi))
            if x.dtype == np.float64:
                _add(moments, x, scratch)
            else:
                np.copyto(x64[:k], x)
                _add(moments, x64[:k], scratch)
    return finish(moments, lo, hi, zeros, nans, infs, numel)


def _int_stats(blocks: Iterator[np.ndarray], numel: int) -> dict[str, Any]:
    lo: int | None = None
    hi: int | None = None
    total = 0.0
    zeros = 0
    for raw in blocks:
        x = raw.view(np.uint8) if raw.dtype == np.bool_ else raw
        zeros += len(x) - int(np.count_nonzero(x))
        b_lo, b_hi = int(x.min()), int(x.max())
        lo = b_lo if lo is None else min(lo, b_lo)
        hi = b_hi if hi is None else max(hi, b_hi)
        total += float(np.add.reduce(x, dtype=np.float64))
    stats: dict[str, Any] = {
        "min": lo, "max": hi, "mean": total / numel if numel else None, "std": None, "mean_abs": None,
        "zeros_fraction": zeros / numel if numel else None, "nan": 0, "inf": 0,
    }
    stats["flags"] = flags(stats, numel, zeros)
    return stats

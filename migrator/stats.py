"""Per-tensor value statistics, streamed: `migrate inspect --stats`.

Every tensor is read window by window (windows.py), so memory stays at a few windows whatever
the tensor's size. F32/F16/BF16/F64 windows are reduced in one pass by the compiled
`float_stats` loop (migrator/_kernels.c; AVX2 when the CPU has it), the next window on a worker
thread; without the kernels numpy reduces blocks of BLOCK elements (about 4x slower:
benchmarks/RESULTS.md). Both give the same figures to rounding. What holds:

- floats: `min`, `max`, `mean`, `std` (population, ddof=0) and `mean_abs` are over the finite
  elements, accumulated in float64 (F16/BF16/F8 are widened per block; F32 and F16 values are
  exact in float64); `nan` and `inf` count the rest. A tensor with no finite element has those
  five as None, and so has a mean, std or mean |x| that overflows float64 (F64 values near its
  limit), so the JSON never holds an infinity. Block means and squared deviations are merged with Chan et al.'s pairwise
  formula, which keeps `std` accurate where sum-of-squares minus square-of-sum would cancel.
- integers and bools: `min` and `max` exact (Python ints), `mean` in float64; `std` and
  `mean_abs` None; `nan`/`inf` 0.
- `zeros_fraction`: elements equal to zero (-0.0 included) over all elements.
- flags: `all_zeros`; `all_equal` (min == max over every element, not all zeros, more than one
  element); `has_nan`; `has_inf`.
- dtypes without a numpy view (packed F4/F6, Burn's QFloat) and complex ones get no stats (None).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from .dtypes import DType, Kind
from .formats import Reader, open_file
from .tensor import LazyTensor
from .windows import DEFAULT_WINDOW, windows

BLOCK = 1 << 17
"""Elements reduced per step: their float64 scratch (1 MiB a buffer) stays in the L2 cache."""

FLAGS = ("all_zeros", "all_equal", "has_nan", "has_inf")


def supported(dtype: DType) -> bool:
    """Whether `tensor_stats` computes values for this dtype."""
    return dtype.numpy_name is not None and dtype.kind in (Kind.FLOAT, Kind.INT, Kind.UINT, Kind.BOOL)


def widen(block: np.ndarray) -> np.ndarray:
    """A float block as float32 or float64 values (exactly): F16 through numpy, BF16 by moving its
    bits up (the cheapest exact conversion), F8 through ml_dtypes."""
    if block.dtype == np.float32 or block.dtype == np.float64:
        return block
    if block.dtype.name == "bfloat16":
        return (block.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return block.astype(np.float32)


class _Moments:
    """Running count, mean and sum of squared deviations (Chan et al.), plus sum of |x|."""

    __slots__ = ("abs_sum", "m2", "mean", "n")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.abs_sum = 0.0

    def add(self, x64: np.ndarray, scratch: np.ndarray) -> None:
        """Merge a float64 block (`scratch`: a buffer at least as long, overwritten)."""
        k = len(x64)
        if k == 0:
            return
        t = scratch[:k]
        mean_b = float(x64.sum()) / k
        np.subtract(x64, mean_b, out=t)
        np.square(t, out=t)  # not np.dot: BLAS may start threads that spin on a busy machine
        m2_b = float(t.sum())
        np.abs(x64, out=t)
        self.abs_sum += float(t.sum())
        n = self.n + k
        delta = mean_b - self.mean
        self.mean += delta * k / n
        self.m2 += m2_b + delta * delta * self.n * k / n
        self.n = n


def tensor_stats(tensor: LazyTensor, window: int = DEFAULT_WINDOW) -> dict[str, Any] | None:
    """The tensor's stats (see the module docstring), or None for a dtype without them."""
    dtype = tensor.dtype
    if not supported(dtype):
        return None
    np_dtype = dtype.numpy()
    itemsize = np_dtype.itemsize
    window -= window % itemsize
    numel = tensor.numel
    kernel_kind = _KERNEL_KINDS.get(dtype.name)
    if kernel_kind is not None:
        from .casts import kernels

        if kernels is not None:
            size = max(window, itemsize)
            fresh = tensor.span is not None and tensor.chunks is None and tensor.nbytes > size
            return _kernel_stats(kernels, windows(tensor, size), kernel_kind, np_dtype, numel, fresh)
    if dtype.kind is Kind.FLOAT:
        return _float_stats(_blocks(tensor, np_dtype, window), numel)
    return _int_stats(_blocks(tensor, np_dtype, window), numel, dtype.kind is Kind.BOOL)


def _blocks(tensor: LazyTensor, np_dtype: np.dtype, window: int) -> Iterator[np.ndarray]:
    for win in windows(tensor, max(window, np_dtype.itemsize)):
        arr = np.frombuffer(win, dtype=np_dtype)
        for start in range(0, len(arr), BLOCK):
            yield arr[start:start + BLOCK]


_KERNEL_KINDS = {"F32": 0, "FLEX32": 0, "F64": 1, "F16": 2, "BF16": 3}
"""The dtypes the compiled `float_stats` loop reads (its `kind` argument)."""


def _kernel_stats(kernels: Any, wins: Iterator[Any], kind: int, np_dtype: np.dtype, numel: int,
                  parallel: bool) -> dict[str, Any]:
    """`_float_stats` with each window reduced in one pass by the compiled loop (migrator/_kernels.c):
    sums of x - shift and its square, merged as `_Moments.add` merges blocks. The shift is the
    mean of the windows merged so far (the first window's first finite element before that), so
    the squares never cancel badly. `parallel` (fresh windows only, not a reused buffer): the next
    window is reduced on a worker thread while this one is merged, its shift one window behind."""
    m = _Moments()
    lo, hi = math.inf, -math.inf
    zeros = nans = infs = 0
    start: list[float] = []

    def shifted() -> Iterator[tuple[Any, float]]:
        for win in wins:
            if m.n:
                yield win, m.mean
                continue
            if not start:
                first = float(np.frombuffer(win, dtype=np_dtype, count=1)[0])
                start.append(first if math.isfinite(first) else 0.0)
            yield win, start[0]

    def reduce(item: tuple[Any, float]) -> tuple[float, tuple[Any, ...]]:
        win, shift = item
        return shift, kernels.float_stats(win, kind, shift)

    if parallel:
        from .casts import pipelined

        results: Iterator[tuple[float, tuple[Any, ...]]] = pipelined(reduce, shifted(), 1)
    else:
        results = map(reduce, shifted())
    for shift, (k, b_lo, b_hi, s1, s2, sa, b_zeros, b_nans, b_infs) in results:
        zeros += b_zeros
        nans += b_nans
        infs += b_infs
        if not k:
            continue
        lo, hi = min(lo, b_lo), max(hi, b_hi)
        mean_b = shift + s1 / k
        m2_b = max(s2 - s1 * s1 / k, 0.0)
        n = m.n + k
        delta = mean_b - m.mean
        m.mean += delta * k / n
        m.m2 += m2_b + delta * delta * m.n * k / n
        m.abs_sum += sa
        m.n = n
    return _finish(m, lo, hi, zeros, nans, infs, numel)


def _float_stats(blocks: Iterator[np.ndarray], numel: int) -> dict[str, Any]:
    moments = _Moments()
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
                moments.add(x, scratch)
            else:
                np.copyto(x64[:k], x)
                moments.add(x64[:k], scratch)
    return _finish(moments, lo, hi, zeros, nans, infs, numel)


def _finish(moments: _Moments, lo: float, hi: float, zeros: int, nans: int, infs: int,
            numel: int) -> dict[str, Any]:
    finite = moments.n
    stats: dict[str, Any] = {
        "min": lo if finite else None,
        "max": hi if finite else None,
        "mean": moments.mean if finite else None,
        "std": math.sqrt(max(moments.m2, 0.0) / finite) if finite else None,
        "mean_abs": moments.abs_sum / finite if finite else None,
        "zeros_fraction": zeros / numel if numel else None,
        "nan": nans,
        "inf": infs,
    }
    for key in ("mean", "std", "mean_abs"):  # F64 values near the float64 limit overflow their sums
        if stats[key] is not None and not math.isfinite(stats[key]):
            stats[key] = None
    stats["flags"] = _flags(stats, numel, zeros)
    return stats


def _int_stats(blocks: Iterator[np.ndarray], numel: int, is_bool: bool) -> dict[str, Any]:
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
    stats["flags"] = _flags(stats, numel, zeros)
    return stats


def _flags(stats: dict[str, Any], numel: int, zeros: int) -> list[str]:
    flags = []
    if numel and zeros == numel:
        flags.append("all_zeros")
    elif numel > 1 and not stats["nan"] and not stats["inf"] and stats["min"] is not None \
            and stats["min"] == stats["max"]:
        flags.append("all_equal")
    if stats["nan"]:
        flags.append("has_nan")
    if stats["inf"]:
        flags.append("has_inf")
    return flags


def add_stats(info: dict[str, Any], reader: Reader, window: int = DEFAULT_WINDOW) -> None:
    """Give each tensor entry of an `inspect` document (`summarize(reader)`) its `stats` and
    `flags` (the stats dict without `flags`; None and [] for a dtype without stats)."""
    for entry, tensor in zip(info["tensors"], reader.tensors, strict=True):
        stats = tensor_stats(tensor, window)
        entry["flags"] = [] if stats is None else stats.pop("flags")
        entry["stats"] = stats
    flagged: dict[str, int] = {}
    for entry in info["tensors"]:
        for flag in entry["flags"]:
            flagged[flag] = flagged.get(flag, 0) + 1
    info["totals"]["flagged"] = flagged


def inspect_with_stats(path: str | os.PathLike[str], *, format: str = "auto", window: int = DEFAULT_WINDOW,
                       **options: Any) -> dict[str, Any]:
    """`inspect_file`'s document with per-tensor stats and flags."""
    from .inspect import summarize

    with open_file(path, format, **options) as reader:
        info = summarize(reader)
        add_stats(info, reader, window)
        return info


STATS_HEADER = ["min", "max", "mean", "std", "mean |x|", "zeros", "nan", "inf", "flags"]


def _g(x: float | int | None) -> str:
    if x is None:
        return "-"
    return str(x) if isinstance(x, int) else f"{x:.4g}"


def stats_cells(entry: dict[str, Any]) -> list[str]:
    """The text table's stats columns of one `inspect` tensor entry."""
    s = entry.get("stats")
    flags = ", ".join(f.replace("_", " ") for f in entry.get("flags", ())) or "-"
    if s is None:
        return ["-"] * (len(STATS_HEADER) - 1) + [flags]
    zeros = "-" if s["zeros_fraction"] is None else f"{100 * s['zeros_fraction']:.1f}%"
    return [_g(s["min"]), _g(s["max"]), _g(s["mean"]), _g(s["std"]), _g(s["mean_abs"]), zeros, str(s["nan"]),
            str(s["inf"]), flags]

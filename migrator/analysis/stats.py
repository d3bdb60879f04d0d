"""Per-tensor value statistics, streamed: `migrate inspect --stats`.

Every tensor is read window by window (windows.py), so memory stays at a few windows whatever
the tensor's size. F32/F16/BF16/F64 windows are reduced in one pass by the compiled
`float_stats` loop (migrator/core/kernels/stats.c; AVX2 when the CPU has it), the next window on a worker
thread, without importing numpy; other dtypes, and all of them without the kernels, go through
numpy (stats_numpy.py; about 4x slower: benchmarks/RESULTS.md). Both give the same figures to
rounding. What holds:

- floats: `min`, `max`, `mean`, `std` (population, ddof=0) and `mean_abs` are over the finite
  elements, accumulated in float64 (F16/BF16/F8 are widened exactly); `nan` and `inf` count the
  rest. A tensor with no finite element has those five as None, and so has a mean, std or
  mean |x| that overflows float64 (F64 values near its limit), so the JSON never holds an
  infinity. Block means and squared deviations are merged with Chan et al.'s pairwise formula,
  which keeps `std` accurate where sum-of-squares minus square-of-sum would cancel.
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
import struct
from collections.abc import Iterator
from typing import Any

from ..core import native
from ..core.dtypes import DType, Kind
from ..core.tensor import LazyTensor
from ..files.io import Reader, open_file
from .moments import Moments, finish
from .windows import DEFAULT_WINDOW, ahead, windows

_KERNEL_KINDS = {"F32": 0, "FLEX32": 0, "F64": 1, "F16": 2, "BF16": 3}
"""The dtypes the compiled `float_stats` loop reads (its `kind` argument)."""


def supported(dtype: DType) -> bool:
    """Whether `tensor_stats` computes values for this dtype."""
    return dtype.numpy_name is not None and dtype.kind in (Kind.FLOAT, Kind.INT, Kind.UINT, Kind.BOOL)


def tensor_stats(tensor: LazyTensor, window: int = DEFAULT_WINDOW) -> dict[str, Any] | None:
    """The tensor's stats (see the module docstring), or None for a dtype without them."""
    dtype = tensor.dtype
    if not supported(dtype):
        return None
    itemsize = dtype.itemsize or 1
    window = max(window - window % itemsize, itemsize)
    kind = _KERNEL_KINDS.get(dtype.name)
    kernels = native.kernels
    if kind is not None and kernels is not None:
        fresh = tensor.span is not None and tensor.chunks is None and tensor.nbytes > window
        return _kernel_stats(kernels, windows(tensor, window), kind, tensor.numel, fresh)
    from . import stats_numpy

    return stats_numpy.tensor_stats(tensor, window)


def _first(win: Any, kind: int) -> float:
    """A window's first element (struct, not numpy)."""
    head = bytes(memoryview(win)[:8])
    if kind == 3:  # BF16: the top half of a float32
        return float(struct.unpack("<f", b"\0\0" + head[:2])[0])
    fmt, size = {0: ("<f", 4), 1: ("<d", 8), 2: ("<e", 2)}[kind]
    return float(struct.unpack(fmt, head[:size])[0])


def _kernel_stats(kernels: Any, wins: Iterator[Any], kind: int, numel: int, parallel: bool) -> dict[str, Any]:
    """Each window reduced in one pass by the compiled loop: sums of x - shift and of its square,
    merged as blocks are. The shift is the mean of the windows merged so far (the first window's
    first finite element before that), so the squares never cancel badly. `parallel` (fresh
    windows only, never a reused buffer): the next window is reduced on a worker thread while
    this one is merged, its shift then one window behind."""
    m = Moments()
    lo, hi = math.inf, -math.inf
    zeros = nans = infs = 0
    start: list[float] = []

    def shifted() -> Iterator[tuple[Any, float]]:
        for win in wins:
            if m.n:
                yield win, m.mean
                continue
            if not start:
                first = _first(win, kind)
                start.append(first if math.isfinite(first) else 0.0)
            yield win, start[0]

    def reduce(item: tuple[Any, float]) -> tuple[float, tuple[Any, ...]]:
        win, shift = item
        return shift, kernels.float_stats(win, kind, shift)

    results: Iterator[tuple[float, tuple[Any, ...]]] = ahead(reduce, shifted()) if parallel \
        else map(reduce, shifted())
    for shift, (k, b_lo, b_hi, s1, s2, sa, b_zeros, b_nans, b_infs) in results:
        zeros += b_zeros
        nans += b_nans
        infs += b_infs
        if k:
            lo, hi = min(lo, b_lo), max(hi, b_hi)
            m.merge(k, shift + s1 / k, max(s2 - s1 * s1 / k, 0.0), sa)
    return finish(m, lo, hi, zeros, nans, infs, numel)


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
    shown = ", ".join(f.replace("_", " ") for f in entry.get("flags", ())) or "-"
    if s is None:
        return ["-"] * (len(STATS_HEADER) - 1) + [shown]
    zeros = "-" if s["zeros_fraction"] is None else f"{100 * s['zeros_fraction']:.1f}%"
    return [_g(s["min"]), _g(s["max"]), _g(s["mean"]), _g(s["std"]), _g(s["mean_abs"]), zeros, str(s["nan"]),
            str(s["inf"]), shown]

"""A float tensor's stats from its blocks: running moments, the stats dict and its flags.

Shared by the two ways stats.py reduces a tensor (the compiled loop, and numpy in stats_numpy.py),
so both merge their blocks the same way and give the same figures.
"""

from __future__ import annotations

import math
from typing import Any

BLOCK = 1 << 17
"""Elements numpy reduces per step: their float64 scratch (1 MiB a buffer) stays in the L2 cache."""



class Moments:
    """Running count, mean and sum of squared deviations (Chan et al.), plus sum of |x|."""

    __slots__ = ("abs_sum", "m2", "mean", "n")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.abs_sum = 0.0

    def merge(self, k: int, mean_b: float, m2_b: float, abs_sum: float) -> None:
        """Merge a block of `k` finite values: its mean, sum of squared deviations and sum of |x|."""
        if k == 0:
            return
        n = self.n + k
        delta = mean_b - self.mean
        self.mean += delta * k / n
        self.m2 += m2_b + delta * delta * self.n * k / n
        self.abs_sum += abs_sum
        self.n = n


def finish(moments: Moments, lo: float, hi: float, zeros: int, nans: int, infs: int,
           numel: int) -> dict[str, Any]:
    """A float tensor's stats dict (with its `flags`) from what its blocks added up to."""
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
    stats["flags"] = flags(stats, numel, zeros)
    return stats


def flags(stats: dict[str, Any], numel: int, zeros: int) -> list[str]:
    """The flags that hold for a stats dict, in this order: all_zeros or all_equal, has_nan, has_inf."""
    found = []
    if numel and zeros == numel:
        found.append("all_zeros")
    elif numel > 1 and not stats["nan"] and not stats["inf"] and stats["min"] is not None \
            and stats["min"] == stats["max"]:
        found.append("all_equal")
    if stats["nan"]:
        found.append("has_nan")
    if stats["inf"]:
        found.append("has_inf")
    return found

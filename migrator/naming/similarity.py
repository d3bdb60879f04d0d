"""String similarity for "did you mean" hints, matching Burn's suggestions exactly.

Burn uses the `textdistance` crate's Jaro, which counts transpositions differently from textbook
Jaro (each matched character found left of the previous match counts one), so library
implementations (jellyfish, rapidfuzz) give different scores and would change which hint, if any,
is shown.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from functools import lru_cache

from .indices import strip_enum_variant

__all__ = ["SUGGESTION_THRESHOLD", "did_you_mean", "jaro"]

SUGGESTION_THRESHOLD = 0.7


def jaro(a: str, b: str) -> float:
    """textdistance-crate Jaro similarity over Unicode code points, in [0, 1]."""
    l1, l2 = len(a), len(b)
    if l1 == 0 or l2 == 0:
        return 1.0 if l1 == l2 else 0.0
    if l1 == 1 and l2 == 1:
        return 1.0 if a == b else 0.0
    window = max(l1, l2) // 2 - 1
    # "The first j in [lo, hi] with b[j] == ch not yet used" is found by bisecting the ascending
    # positions of ch in b (j <= l2 - 1 always holds, so only i + window bounds it above).
    positions = _positions(b)
    used = bytearray(l2)
    matches = transpositions = last_j = 0
    for i, ch in enumerate(a):
        slots = positions.get(ch)
        if slots is None:
            continue
        hi = i + window
        k = bisect_left(slots, i - window) if i > window else 0
        n = len(slots)
        while k < n:
            j = slots[k]
            if j > hi:
                break
            k += 1
            if not used[j]:
                used[j] = 1
                matches += 1
                if j < last_j:
                    transpositions += 1
                last_j = j
                break
    if matches == 0:
        return 0.0
    return _score(matches, transpositions, l1, l2)


@lru_cache(maxsize=8192)
def _positions(text: str) -> dict[str, tuple[int, ...]]:
    """Ascending positions of each character; cached because one unused name meets many paths."""
    found: dict[str, list[int]] = {}
    for j, ch in enumerate(text):
        found.setdefault(ch, []).append(j)
    return {ch: tuple(js) for ch, js in found.items()}


def _score(m: int, t: int, l1: int, l2: int) -> float:
    # One expression for both the score and its upper bound, so pruning compares like with like.
    return (m / l1 + m / l2 + (m - t) / m) / 3


def did_you_mean(missing: str, unused: Sequence[str]) -> str | None:
    """The suggestion Burn prints under a missing tensor, or None.

    First the path without its enum-variant segment if that is unused; otherwise the unused name
    with the highest Jaro score >= 0.7, ties going to the alphabetically first.
    """
    stripped = strip_enum_variant(missing)
    if stripped is not None and stripped in unused:
        return stripped
    best: str | None = None
    best_score = SUGGESTION_THRESHOLD
    for candidate in sorted(unused):
        # jaro can be no higher than with every character of the shorter string matched in order;
        # a later (alphabetically) candidate must beat the best strictly, so prune on <=.
        shortest = min(len(missing), len(candidate))
        if shortest == 0 or len(missing) + len(candidate) == 2:
            bound = 1.0
        else:
            bound = _score(shortest, 0, len(missing), len(candidate))
        if bound < best_score or (best is not None and bound <= best_score):
            continue
        score = jaro(missing, candidate)
        if score > best_score or (best is None and score >= best_score):
            best, best_score = candidate, score
    return best

"""Contiguous indices, enum-variant segments and name collisions, as Burn's store applies them
(docs/burn-compatibility.md, "Names")."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["contiguous_names", "find_collisions", "parse_usize", "strip_enum_variant"]

_USIZE_MAX = 2**64 - 1


def parse_usize(text: str) -> int | None:
    """Rust's `str::parse::<usize>` on a 64-bit target: '+'? ASCII digits, no overflow; else None."""
    digits = text[1:] if text.startswith("+") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    significant = digits.lstrip("0") or "0"
    if len(significant) > 20:  # over u64 for sure; int() of 4,300+ digits would raise
        return None
    value = int(significant)
    return value if value <= _USIZE_MAX else None


_MAY_HAVE_INDEX = re.compile(r"(?:^|\.)\+?[0-9]")
"""A segment that parse_usize accepts starts like this; names without one are left alone quickly."""


def contiguous_names(names: list[str]) -> list[str]:
    """Every numeric path segment renumbered to 0, 1, 2, … per position key (the rank of its value
    among the values seen at that position), in input order.

    Closes the gaps PyTorch's `nn.Sequential` leaves for parameter-free layers. The key of an index
    is the *original* prefix before it, so renumbering one level never changes another's key. An
    unchanged name is the same object.

    Why per prefix: the sibling tensors of a model share most of their path (``h.7.attn.c_attn`` is
    the head of both ``.weight`` and ``.bias``), so each distinct path prefix is split, parsed and
    renumbered once, not once per tensor and segment.
    """
    seen: dict[str, set[int]] = {}
    # prefix -> (parent prefix or None at the root, index value of its last segment or None)
    nodes: dict[str, tuple[str | None, int | None]] = {}
    may_have_index = _MAY_HAVE_INDEX.search
    respelled = False
    for name in names:
        if may_have_index(name) is None:
            continue
        path = name
        while path not in nodes:
            head, sep, last = path.rpartition(".")
            value = parse_usize(last) if last and (last[0].isdigit() or last[0] == "+") else None
            if value is not None:
                seen.setdefault(head + "." if sep else "", set()).add(value)
                respelled = respelled or last != str(value)  # '01', '+2': renumbering rewrites them
            if not sep:
                nodes[path] = (None, value)
                break
            nodes[path] = (head, value)
            path = head
    if not respelled and all(max(values) == len(values) - 1 for values in seen.values()):
        return list(names)  # every key already numbers 0..n-1 (distinct values): nothing moves
    tables = {key: {v: new for new, v in enumerate(sorted(values))} for key, values in seen.items()}
    renamed: dict[str, str] = {}

    def rename(path: str) -> str:
        """`path` with its indices renumbered (memoised; iterative up to the first known ancestor)."""
        chain: list[str] = []
        while path not in renamed:
            chain.append(path)
            parent = nodes[path][0]
            if parent is None:
                break
            path = parent
        for p in reversed(chain):
            parent, value = nodes[p]
            if parent is None:
                new = p if value is None else str(tables[""][value])
                renamed[p] = p if new == p else new
            else:
                new_parent = renamed[parent]
                if value is None:
                    renamed[p] = p if new_parent is parent else f"{new_parent}.{p.rpartition('.')[2]}"
                else:
                    new = f"{new_parent}.{tables[parent + '.'][value]}"
                    renamed[p] = p if new == p else new
        return renamed[chain[0]] if chain else renamed[path]

    return [rename(name) if name in nodes else name for name in names]


def _is_variant_segment(segment: str) -> bool:
    """Burn's CamelCase heuristic for an enum variant name (e.g. `BaseConv`)."""
    return (
        bool(segment)
        and segment[0].isupper()
        and len(segment.encode("utf-8")) > 1
        and any(ch.islower() for ch in segment[1:])
    )


def strip_enum_variant(path: str) -> str | None:
    """`path` without its first inner CamelCase segment, or None when it has none (the first
    step of Burn's "did you mean" for an enum variant).

    Used to suggest `feature.weight` for a missing `feature.BaseConv.weight`.
    """
    segments = path.split(".")
    for i in range(1, len(segments) - 1):
        if _is_variant_segment(segments[i]):
            return ".".join(segments[:i] + segments[i + 1 :])
    return None


def find_collisions(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """New names that two or more originals map onto, with those originals in input order.

    Burn lets the later tensor win silently; migrator reports instead.
    """
    by_new: dict[str, list[str]] = {}
    for new, original in pairs:
        by_new.setdefault(new, []).append(original)
    return {new: originals for new, originals in by_new.items() if len(originals) > 1}

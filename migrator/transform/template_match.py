"""Which source tensor fills each template slot: by name, or by position in renumbered indices.

A template names its slots as its own file does. A PyTorch `nn.Sequential` checkpoint used as the
template of the way back from Burn keeps the gaps of its parameter-free layers (`0, 3, 5`), while
the Burn file numbers the same layers `0, 1, 2`. Two ways to find a slot's source are tried:

- by name: the slot's own name (then enum variants skipped, then the adapter's alternative name,
  e.g. `gamma` for `weight`), as Burn does;
- by position: the same lookups with the slot's index segments renumbered 0, 1, 2, ... per prefix
  over the template's names (`contiguous_names`), so the k-th index of a prefix in the template
  meets the k-th in the source.

When the two agree wherever both find something, each slot takes what was found. When they
disagree on some slot, the one that fills every slot wins (the other's hits are coincidences of
the numbering: `3.weight` is the fourth layer in one file and the second in the other); when both
or neither fill every slot, the match is ambiguous and `AmbiguousMatch` names the slots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..naming import contiguous_names

Lookup = Callable[[str], "str | None"]
"""A slot name -> the source key it names (exact, enum-free or alternative), or None."""


class AmbiguousMatch(ValueError):
    """Template slots that match one source tensor by name and another by position."""


def match_slots(slots: Sequence[str], lookup: Lookup) -> list[str | None]:
    """The source key of each template slot (None: no source), by name or by index position."""
    by_name = [lookup(s) for s in slots]
    renumbered = contiguous_names(list(slots))
    if all(r is s or r == s for r, s in zip(renumbered, slots, strict=True)):
        return by_name  # the template numbers its indices 0..n-1: position is the name
    by_position = [b if r is s or r == s else lookup(r) for r, s, b in zip(renumbered, slots, by_name, strict=True)]
    conflicts = [(s, b, p) for s, b, p in zip(slots, by_name, by_position, strict=True)
                 if b is not None and p is not None and b != p]
    if not conflicts:
        merged = [b if b is not None else p for b, p in zip(by_name, by_position, strict=True)]
        found = [m for m in merged if m is not None]
        if len(set(found)) == len(found) or len(set(filter(None, by_name))) != len(list(filter(None, by_name))):
            return merged  # no source claimed twice, or claimed twice by name alone (reported as missing)
    return _one_way(slots, by_name, by_position, conflicts)


def _one_way(slots: Sequence[str], by_name: list[str | None], by_position: list[str | None],
             conflicts: Sequence[tuple[str, str | None, str | None]]) -> list[str | None]:
    """The one complete way when the two ways differ; otherwise the match is ambiguous."""
    name_full, position_full = None not in by_name, None not in by_position
    if position_full and not name_full:
        return by_position
    if name_full and not position_full:
        return by_name
    if not conflicts:  # they agree slot by slot but claim one source twice across slots
        conflicts = [(s, b, p) for s, b, p in zip(slots, by_name, by_position, strict=True) if b != p]
    shown = "; ".join(f"'{s}' is {_said(b)} by name, {_said(p)} by index position" for s, b, p in conflicts[:5])
    more = f" (and {len(conflicts) - 5} more)" if len(conflicts) > 5 else ""
    which = "both fill every slot" if name_full else "neither fills every slot"
    raise AmbiguousMatch(
        f"target.template: template slots match two ways ({which}): {shown}{more}; make the names agree "
        "(source.contiguous_indices, or remap: rules) so that one way matches")


def _said(key: str | None) -> str:
    return "nothing" if key is None else f"'{key}'"

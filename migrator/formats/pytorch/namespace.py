"""A pickled `argparse.Namespace` (a training script's `args`, as Megatron-LM saves them) as a plain dict.

The restricted interpreter reads a Namespace as an allow-listed record (`safepickle`): its fields are
the state its pickle gave it, kept as data (strings, numbers, lists; an enum or any other class in
them an inert placeholder). Nothing of argparse is imported or run.
"""

from __future__ import annotations

from typing import Any

from ..safepickle import values as sp

NAMESPACE = "argparse.Namespace"


def namespace_fields(value: Any) -> dict[str, Any] | None:
    """The fields of a pickled Namespace (string keys only), or None when `value` is not one."""
    if not isinstance(value, sp.Record) or value.name != NAMESPACE:
        return None
    state = value.state
    if isinstance(state, tuple) and len(state) == 2:  # (dict, slots), as BUILD may give it
        state = state[0]
    if not isinstance(state, dict):
        return {}
    return {k: v for k, v in state.items() if isinstance(k, str)}


def described(value: Any) -> str:
    """A pickled value in a few words, for an error message (never a whole nested value)."""
    return sp.describe(value)

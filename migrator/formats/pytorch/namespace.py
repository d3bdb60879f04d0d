"""A pickled `argparse.Namespace` (a training script's `args`, as Megatron-LM saves them), read as
plain data and written back.

The restricted interpreter reads a Namespace as an allow-listed record (`safepickle`): its fields are
the state its pickle gave it, kept as data (strings, numbers, lists; an enum or any other class in
them an inert placeholder). Nothing of argparse is imported or run. `plain` makes such a value JSON-like
data. Writing, `NamespaceValue` and `DtypeValue` stand for a Namespace and a torch dtype in a value the
DCP item writer pickles (`formats.dcp.items`), as Python and torch pickle them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..safepickle import values as sp

NAMESPACE = "argparse.Namespace"
MAX_DEPTH = 16


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


def plain(v: Any, depth: int = 0) -> Any:
    """`v` as JSON-like data: numbers, strings, lists, dicts; a Namespace its fields, a torch dtype its
    name (`torch.bfloat16` -> "bfloat16"); what is not data (a placeholder of another class: an enum of
    Megatron's, a function) becomes None."""
    if depth > MAX_DEPTH:
        return None
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, sp.TorchDtype):
        return v.name.removeprefix("torch.")
    fields = namespace_fields(v)
    if fields is not None:
        return {k: plain(x, depth + 1) for k, x in fields.items()}
    if isinstance(v, dict):
        return {k: plain(x, depth + 1) for k, x in v.items() if type(k) in (str, int)}
    if isinstance(v, (list, tuple)):
        return [plain(x, depth + 1) for x in v]
    return None


def described(value: Any) -> str:
    """A pickled value in a few words, for an error message (never a whole nested value)."""
    return sp.describe(value)


@dataclass(frozen=True)
class NamespaceValue:
    """An `argparse.Namespace` to write: pickled as Python pickles one (the class, NEWOBJ, then its
    fields as the state BUILD sets), so `torch.load` builds it and the reader above reads it back."""

    fields: Mapping[str, Any]


@dataclass(frozen=True)
class DtypeValue:
    """A torch dtype to write (`float32`, `bfloat16`): pickled as the global `torch.<name>`, as torch
    pickles a dtype (allowed by `torch.load(weights_only=True)`)."""

    name: str

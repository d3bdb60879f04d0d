"""The words of recipe issues: how a value, a type or a field is described, and the hints given."""

from __future__ import annotations

import typing
from datetime import date
from typing import Any, Literal

from pydantic import BaseModel
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from . import adapter_names
from .issues import _yaml_scalar
from .model import (
    CastSpec,
    FloatCastSpec,
    HalfPrecisionSpec,
    ScalarSpec,
)
from .model_types import _is_model, _model_field, _union_members, _unwrap
from .yaml_nodes import _Constructor

_MODEL_SPELLINGS: dict[type, str] = {
    CastSpec: "{cast: DTYPE}",
    HalfPrecisionSpec: adapter_names.WITH_OPTIONS["half_precision"],
    FloatCastSpec: adapter_names.WITH_OPTIONS["float_cast"],
}
_EXPECTED = {
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "path_type": "a path (a string)",
}



def _node_value(node: Node | None, keys: dict[int, Any]) -> Any:
    """A node's value in the shapes pydantic saw (only scalars are reconstructed)."""
    if isinstance(node, ScalarNode):
        try:
            return _Constructor().construct_object(node, deep=True)
        except Exception:
            return node.value
    if isinstance(node, MappingNode):
        return {}
    if isinstance(node, SequenceNode):
        return []
    return None


def _describe_value(value: Any, node: Node | None = None) -> str:
    """What the user wrote, in YAML terms: 'maybe', 3, true, null, a list, a mapping."""
    if isinstance(value, dict) or isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(value, list | tuple) or isinstance(node, SequenceNode):
        return "a list"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"'{shown}'"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, date):
        return f"a date ({value.isoformat()})"
    if isinstance(value, bytes):
        return "binary data"
    if isinstance(value, set):
        return "a set"
    return type(value).__name__


def _type_hint(kind: str, value: Any, node: Node | None) -> str | None:
    text = node.value if isinstance(node, ScalarNode) else None
    if kind == "string_type" and text is not None and value is not None:
        return f"quote it to keep it as text: '{text}'"
    if kind == "list_type":
        if value is None:
            return "write [] for none, or leave the key out"
        if isinstance(node, MappingNode):
            return "start each entry with '- '"
        if text:
            return f"write [{text}] for a one-entry list"
    if kind == "dict_type" and value is None:
        return "write {} for none, or leave the key out"
    return None


def _field_description(owner: type[BaseModel] | None, key: Any) -> str | None:
    if owner is None:
        return None
    found = _model_field(owner, key)
    text = found[1].description if found else None
    if not text:
        return None
    text = text.rstrip(".")  # a field description reads as a hint once de-capitalised
    return text[0].lower() + text[1:] if text[1:2].islower() else text


def _literal_strings(tp: Any) -> list[str]:
    """The string values a Literal (or the Literals of a union) accepts."""
    tp = _unwrap(tp) if tp is not None else None
    members = _union_members(tp) or [tp]
    out: list[str] = []
    for m in members:
        m = _unwrap(m)
        if typing.get_origin(m) is Literal:
            out.extend(a for a in typing.get_args(m) if isinstance(a, str))
    return out


def _describe_type(tp: Any) -> str:
    """'keep', 'template' or {cast: DTYPE}; a string or a list of strings; ..."""
    alternatives: list[str] = []
    for m in _union_members(_unwrap(tp)) or [tp]:
        u = _unwrap(m)
        origin = typing.get_origin(u)
        if origin is Literal:
            alternatives.extend(f"'{a}'" if isinstance(a, str) else _yaml_scalar(a) for a in typing.get_args(u))
        elif origin is list:
            item = _unwrap(typing.get_args(u)[0])
            alternatives.append("a list of strings" if item is str else "a list")
        elif origin is dict:
            value = _unwrap(typing.get_args(u)[1])
            alternatives.append("a mapping such as {epoch: {int: 42}}" if value is ScalarSpec else "a mapping")
        elif _is_model(u):
            alternatives.append(_MODEL_SPELLINGS.get(u, "a mapping"))
        elif u is str:
            alternatives.append("a string")
        elif u is bool:
            alternatives.append("true or false")
        elif u is int:
            alternatives.append("an integer")
        elif u is float:
            alternatives.append("a number")
        else:
            alternatives.append(getattr(u, "__name__", str(u)))
    return _join_or(alternatives)


def _join_or(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} or {items[-1]}"

"""Paths through the recipe model's types: which model, field and union an error location crosses.

Pydantic's error locations are paths through the data plus the `Tag` of each tagged union's
member (`recipe._tagged`); these helpers walk the annotations beside the path, so the rest of the
loader knows which model a key belongs to and which member a union was tried as.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel, Tag

from .model import Recipe
from .ops import OpSpec


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional: neither adds a level to pydantic's error locations. A type made
    when its model is built (`ops.OpSpec`, from the registry) is walked as what it is made into."""
    while True:
        if tp is OpSpec:
            tp = OpSpec.annotation()
            continue
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return tp
            tp = members[0]
        else:
            return tp


def _union_members(tp: Any) -> list[Any] | None:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return None


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _tagged_member(tag: Any, members: list[Any]) -> Any:
    """The member of a tagged union (`recipe._tagged`) that pydantic's location names by its `Tag`."""
    for m in members:
        if typing.get_origin(m) is typing.Annotated and any(
                isinstance(a, Tag) and a.tag == tag for a in typing.get_args(m)[1:]):
            return m
    return None


def _model_field(model: type[BaseModel], key: Any) -> tuple[str, Any] | None:
    """(name, field) for a YAML key: its alias, or its Python name (`populate_by_name`)."""
    for name, f in model.model_fields.items():
        if key in (f.alias, name):
            return name, f
    return None


def _yaml_keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


@dataclass
class _Site:
    """A union on an error's path: where it is (data path), which member failed, and the union."""

    path: tuple[Any, ...]
    tag: Any
    union: Any


@dataclass
class _Err:
    """A pydantic error with its location split into the data path and the unions crossed."""

    data: tuple[Any, ...]
    sites: list[_Site]
    owner: type[BaseModel] | None  # model whose field the last data segment names
    tp: Any  # annotation at the error's location (None when unknown)
    raw: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.raw["type"])


def _split_loc(loc: tuple[Any, ...], raw: dict[str, Any]) -> _Err:
    tp: Any = Recipe
    data: list[Any] = []
    sites: list[_Site] = []
    owner: type[BaseModel] | None = None
    for seg in loc:
        tp = _unwrap(tp) if tp is not None else None
        members = _union_members(tp) if tp is not None else None
        if members is not None:
            sites.append(_Site(tuple(data), seg, tp))
            tp = _tagged_member(seg, members)
            continue
        data.append(seg)
        owner = None
        if _is_model(tp):
            owner = tp
            found = _model_field(tp, seg)
            tp = found[1].annotation if found else None
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1] if seg != "[key]" else typing.get_args(tp)[0]
        elif typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0]
        else:
            tp = None
    return _Err(tuple(data), sites, owner, tp, raw)

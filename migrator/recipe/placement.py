"""Pydantic errors -> recipe issues placed on YAML nodes (`recipe.yaml:LINE:COL`).

Pydantic knows *what* is wrong but not *where*: `_Mapper` walks each error's data path through
the composed node tree, keeps at each union only the member the input was meant to be, and merges
an unknown key with the missing key it misspells.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..naming.similarity import did_you_mean
from ..ops.checks import RECIPE_VALUE
from . import adapter_names
from .issues import RecipeIssue, _quote_key, _render_loc
from .model import NO_MEMBER, HalfPrecisionSpec, Recipe
from .model_types import _Err, _is_model, _split_loc, _union_members, _unwrap, _yaml_keys
from .wording import (
    _EXPECTED,
    _describe_type,
    _describe_value,
    _field_description,
    _join_or,
    _literal_strings,
    _node_value,
    _type_hint,
)


@dataclass
class _Issue:
    """An issue before rendering; `kind`/`key`/`suggestion` let extra+missing pairs merge."""

    data: tuple[Any, ...]
    node: Node | None
    message: str
    hint: str | None = None
    kind: str = ""
    key: Any = None
    suggestion: str | None = None


class _Mapper:
    """Turns one ValidationError into RecipeIssues located in the YAML node tree."""

    def __init__(self, shown: str, root: MappingNode, keys: dict[int, Any]) -> None:
        self.shown = shown
        self.root = root
        self.keys = keys

    def issues(self, exc: ValidationError) -> list[RecipeIssue]:
        errs = [_split_loc(tuple(e["loc"]), dict(e)) for e in exc.errors(include_url=False)]
        pending = self._collapse(errs, 0)
        pending = _merge_misspelt(pending)
        return [self._render(p) for p in pending]

    # -- unions -----------------------------------------------------------------------------------
    def _collapse(self, errs: list[_Err], depth: int) -> list[_Issue]:
        """Plain errors as they are; at each union, only the member the input was meant to be."""
        out: list[_Issue] = []
        sites: dict[tuple[Any, ...], list[_Err]] = {}
        for e in errs:
            if len(e.sites) > depth:
                sites.setdefault(e.sites[depth].path, []).append(e)
            else:
                out.extend(self._issue(e))
        for path, group in sites.items():
            members: dict[Any, list[_Err]] = {}
            for e in group:
                members.setdefault(e.sites[depth].tag, []).append(e)
            ranks = {tag: _rank(m, len(path)) for tag, m in members.items()}
            best = max(ranks.values())
            winners = [tag for tag, r in ranks.items() if r == best]
            if len(winners) == 1 and best != (0, 0):  # (0, 0): the member's shape fits, nothing in it does
                out.extend(self._collapse(members[winners[0]], depth + 1))
            else:
                out.append(self._union_issue(path, group[0].sites[depth].union))
        return out

    def _union_issue(self, path: tuple[Any, ...], union: Any) -> _Issue:
        node, _, _ = self._locate(path)
        value = _node_value(node, self.keys)
        members = _union_members(union) or []
        if any(_unwrap(m) is HalfPrecisionSpec for m in members):
            return self._adapter_issue(path, node, value)
        expected = _describe_type(union)
        hint = None
        if isinstance(value, str):
            guess = did_you_mean(value, _literal_strings(union))
            hint = f"did you mean '{guess}'?" if guess else None
        return _Issue(path, node, f"expected {expected}, got {_describe_value(value, node)}", hint)

    def _adapter_issue(self, path: tuple[Any, ...], node: Node | None, value: Any) -> _Issue:
        valid = "valid adapters: " + ", ".join(adapter_names.RECIPE_SPELLINGS)
        if isinstance(node, MappingNode) and len(node.value) == 1:
            key_node = node.value[0][0]
            name = self.keys.get(id(key_node), key_node.value)
            return self._unknown_adapter(path, key_node, name, valid)
        if isinstance(node, MappingNode) and not node.value:
            return _Issue(path, node, "empty adapter entry", valid)
        if isinstance(node, MappingNode):
            names = ", ".join(str(self.keys.get(id(k), k.value)) for k, _ in node.value)
            return _Issue(path, node, f"an adapter entry has exactly one key, the adapter's name (got {names})",
                          "put each adapter in its own list entry; " + valid)
        if isinstance(value, str):
            return self._unknown_adapter(path, node, value, valid)
        return _Issue(path, node, f"expected an adapter name or {{name: options}}, got {_describe_value(value, node)}",
                      valid)

    @staticmethod
    def _unknown_adapter(path: tuple[Any, ...], node: Node | None, name: Any, valid: str) -> _Issue:
        guess = did_you_mean(name, list(adapter_names.ALL)) if isinstance(name, str) else None
        lead = f"did you mean '{guess}'? " if guess else ""
        return _Issue(path, node, f"unknown adapter '{name}'", lead + valid)

    # -- single errors ----------------------------------------------------------------------------
    def _issue(self, e: _Err) -> list[_Issue]:
        kind = e.type
        raw = e.raw
        data = e.data
        value = raw.get("input")
        if data == ("version",) and kind != "missing":
            node, _, _ = self._locate(data)
            shown = _describe_value(_node_value(node, self.keys), node)
            return [_Issue(data, node, f"unsupported recipe version {shown}",
                           "this migrator reads version 1: write 'version: 1'")]
        if kind == "missing":
            parent, _, _ = self._locate(data[:-1])
            name = data[-1]
            hint: str | None = _field_description(e.owner, name)
            if data == ("version",):
                hint = "start the recipe with 'version: 1'"
            return [_Issue(data, parent, f"missing required key '{name}'", hint, "missing", name)]
        if kind == "extra_forbidden":
            node, key_node, _ = self._locate(data)
            name = data[-1]
            hint, suggestion = None, None
            if e.owner is not None:
                valid = _yaml_keys(e.owner)
                suggestion = did_you_mean(name, valid) if isinstance(name, str) else None
                lead = f"did you mean '{suggestion}'? " if suggestion else ""
                hint = f"{lead}valid keys: {', '.join(valid)}"
            return [_Issue(data, key_node or node, f"unknown key {_quote_key(name)}", hint, "extra", name,
                           suggestion)]
        if kind == "invalid_key":  # a model's key; pydantic's loc spells it with str()
            return [self._bad_key(data[:-1], value)]
        if data and data[-1] == "[key]":  # a dict's key; same
            return [self._bad_key(data[:-2], value)]
        if kind in (RECIPE_VALUE, "value_error", "assertion_error"):
            return [self._value_error(e)]
        if kind == NO_MEMBER:  # a union's discriminator found no member of that shape
            return [self._union_issue(data, _unwrap(e.tp))]
        node, _, _ = self._locate(data)
        if kind == "literal_error":
            # a Literal's values, or those a validator gives (a `format:`: the registry's, as validated)
            options = _literal_strings(e.tp) or list(raw.get("ctx", {}).get("options", []))
            expected: str | None = (_join_or([f"'{o}'" for o in options]) if options
                                    else str(raw.get("ctx", {}).get("expected")))
            guess = did_you_mean(value, options) if isinstance(value, str) else None
            hint = f"did you mean '{guess}'?" if guess else None
            return [_Issue(data, node, f"expected {expected}, got {_describe_value(value, node)}", hint)]
        expected = _EXPECTED.get(kind)
        if expected is None:
            return [_Issue(data, node, str(raw.get("msg", kind)))]
        if kind in ("model_type", "model_attributes_type", "dict_type") and _is_model(_unwrap(e.tp)):
            hint = f"valid keys: {', '.join(_yaml_keys(_unwrap(e.tp)))}"
        else:
            hint = _type_hint(kind, value, node)
        return [_Issue(data, node, f"expected {expected}, got {_describe_value(value, node)}", hint)]

    def _bad_key(self, data: tuple[Any, ...], value: Any) -> _Issue:
        parent, _, _ = self._locate(data)
        key_node: Node | None = parent
        if isinstance(parent, MappingNode):
            for k, _v in reversed(parent.value):
                kv = self.keys.get(id(k), k.value)
                if type(kv) is type(value) and kv == value:
                    key_node = k
                    break
        text = key_node.value if isinstance(key_node, ScalarNode) else None
        hint = f"quote it: '{text}'" if text else "keys are names; quote them"
        return _Issue(data, key_node, f"keys must be strings, got {_describe_value(value, key_node)}", hint)

    def _value_error(self, e: _Err) -> _Issue:
        data = e.data
        if e.raw.get("type") == RECIPE_VALUE:  # a validator's complaint: message, key and hint in its context
            ctx = e.raw["ctx"]
            if ctx.get("key") is not None:
                data = (*data, ctx["key"])
            node, _, found = self._locate(data)
            if not found:
                node, _, _ = self._locate(e.data)
                data = e.data
            return _Issue(data, node, ctx["message"], ctx.get("hint"))
        node, _, _ = self._locate(data)
        message = str(e.raw.get("msg", "invalid value")).removeprefix("Value error, ").removeprefix(
            "Assertion failed, ")
        return _Issue(data, node, message)

    # -- locating -----------------------------------------------------------------------------------
    def _locate(self, data: tuple[Any, ...]) -> tuple[Node, Node | None, bool]:
        """The node at `data` (or the deepest one that exists), its key node, and whether found."""
        node: Node = self.root
        key_node: Node | None = None
        for seg in data:
            if seg == "[key]":
                return (key_node or node), key_node, True
            if isinstance(node, MappingNode):
                pair = self._find_key(node, seg)
                if pair is None:
                    return node, None, False
                key_node, node = pair
            elif isinstance(node, SequenceNode) and type(seg) is int and 0 <= seg < len(node.value):
                key_node, node = None, node.value[seg]
            else:
                return node, None, False
        return node, key_node, True

    def _find_key(self, node: MappingNode, seg: Any) -> tuple[Node, Node] | None:
        candidates = [seg, *_ALIAS_TWINS.get(seg, ())] if isinstance(seg, str) else [seg]
        for want in candidates:
            for k, v in reversed(node.value):  # after a merge (<<) the last pair is the one used
                kv = self.keys.get(id(k), _NO_KEY)
                if type(kv) is type(want) and kv == want:
                    return k, v
        return None

    def _render(self, p: _Issue) -> RecipeIssue:
        mark = p.node.start_mark if p.node is not None else None
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
        return RecipeIssue(self.shown, line, col, _render_loc(p.data), p.message, p.hint)


_NO_KEY = object()


def _alias_twins() -> dict[str, tuple[str, ...]]:
    """YAML spelling <-> Python name for aliased fields (`from`/`from_`, ...), over every model."""
    twins: dict[str, set[str]] = {}
    seen: set[type] = set()
    todo: list[Any] = [Recipe]
    while todo:
        tp = todo.pop()
        origin = typing.get_origin(tp)
        if origin is not None:
            todo.extend(a for a in typing.get_args(tp) if not isinstance(a, str | int))
            continue
        if not _is_model(tp) or tp in seen:
            continue
        seen.add(tp)
        for name, f in tp.model_fields.items():
            if f.alias and f.alias != name:
                twins.setdefault(f.alias, set()).add(name)
                twins.setdefault(name, set()).add(f.alias)
            todo.append(f.annotation)
    return {k: tuple(sorted(v)) for k, v in twins.items()}


_ALIAS_TWINS = _alias_twins()


def _rank(errs: list[_Err], base: int) -> tuple[int, int]:
    """How well the input fits a union member: a type mismatch at the union itself is worst,
    keys that do not fit (missing/unknown right below it) next, then the deeper the first error
    the better."""
    depths = [len(e.data) - base for e in errs]
    if any(d <= 0 for d in depths):
        return (0, 0)
    if any(d == 1 and e.type in ("missing", "extra_forbidden") for e, d in zip(errs, depths, strict=True)):
        return (1, 0)
    return (2, min(depths))


def _merge_misspelt(pending: list[_Issue]) -> list[_Issue]:
    """`pth: x` gives 'unknown key pth' and 'missing key path': one problem, reported once."""
    fixed = {(p.data[:-1], p.suggestion) for p in pending if p.kind == "extra" and p.suggestion}
    return [p for p in pending if not (p.kind == "missing" and (p.data[:-1], p.key) in fixed)]


def _sorted_unique(issues: list[RecipeIssue]) -> list[RecipeIssue]:
    unique = list(dict.fromkeys(issues))
    return sorted(unique, key=lambda i: (i.line, i.col))

"""Loading recipe files: YAML -> `Recipe`, with every problem reported as `recipe.yaml:LINE:COL`.

Pydantic knows *what* is wrong but not *where*: its error locations are paths through the data.
This module keeps the composed YAML node tree beside the data, walks each error's path through
both the node tree and the model's type annotations (to drop the `Tag` of a tagged union's member
from the path and to know which model a key belongs to), and turns pydantic's messages into short
ones with hints. Every union with more than one non-null member is tagged (`recipe._tagged`), so
pydantic tries one member, named by our own tag; a value of no member's shape is one issue.

YAML is parsed with PyYAML's SafeLoader only. PyYAML keeps the last of duplicate keys silently,
so duplicates are found on the node tree; aliases are allowed but the expanded tree is bounded
(billion laughs), as is the file size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, Tag, ValidationError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import MigratorError
from .recipe import (
    NO_MEMBER,
    CastPolicy,
    FloatCastAdapter,
    HalfPrecisionAdapter,
    Recipe,
    RecipeValueError,
    ScalarValue,
)
from .similarity import did_you_mean

__all__ = [
    "MAX_NONSTRING_KEYS",
    "MAX_RECIPE_BYTES",
    "MAX_YAML_NODES",
    "LoadedRecipe",
    "RecipeError",
    "RecipeIssue",
    "load_recipe",
    "parse_recipe",
    "recipe_json_schema",
    "recipe_json_schema_text",
]

MAX_RECIPE_BYTES = 10 * 1024 * 1024
MAX_YAML_NODES = 100_000
# Keys that are not strings are always an error (every mapping of a recipe is keyed by names), but
# ints, floats, bools and null hash predictably: thousands of keys that collide (multiples of
# 2**61-1 all hash to 0) make building a dict quadratic. Past this many the loader stops, before
# any dict holding them is built.
MAX_NONSTRING_KEYS = 100

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_REGENERATE = ".venv/bin/python tools/gen_schema.py"

_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
_ADAPTER_SPELLINGS = ("identity", "pytorch_to_burn", "burn_to_pytorch", "half_precision",
                      "{half_precision: {...}}", "{float_cast: {to: DTYPE}}")
_ADAPTER_NAMES = ("identity", "pytorch_to_burn", "burn_to_pytorch", "half_precision", "float_cast")
_MODEL_SPELLINGS: dict[type, str] = {
    CastPolicy: "{cast: DTYPE}",
    HalfPrecisionAdapter: "{half_precision: {...}}",
    FloatCastAdapter: "{float_cast: {to: DTYPE}}",
}


# ---------------------------------------------------------------------------------------------
# Public types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecipeIssue:
    """One problem in a recipe. `line`/`col` are 1-based; 0 means the file as a whole."""

    file: str
    line: int
    col: int
    loc: str
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        parts = [f"{self.file}:{self.line}:{self.col}" if self.line else self.file]
        if self.loc:
            parts.append(self.loc)
        parts.append(self.message)
        text = ": ".join(parts)
        return f"{text} (hint: {self.hint})" if self.hint else text


class RecipeError(MigratorError):
    """A recipe that cannot be used; every problem found is in `issues`, one line each in str()."""

    def __init__(self, issues: Sequence[RecipeIssue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))
        self.file = self.issues[0].file if self.issues else None

    def __str__(self) -> str:
        return "\n".join(str(i) for i in self.issues)


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe plus what running it needs: where it lives and what it hashed to."""

    recipe: Recipe
    path: Path
    base_dir: Path
    text: str
    sha256: str
    warnings: tuple[RecipeIssue, ...] = field(default=())
    # (type, index) of each `modules:` regex -> 'recipe.yaml:LINE:COL', for errors found when planning
    module_origins: dict[tuple[str, int], str] = field(default_factory=dict)
    # (op index, key or '') -> (file, line, col) of each `ops:` entry and its keys, for op errors found when planning
    op_origins: dict[tuple[int, str], tuple[str, int, int]] = field(default_factory=dict)

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """A recipe path made absolute: `~` expanded, relative ones taken from the recipe's folder."""
        p = Path(os.path.expanduser(os.fspath(path)))
        return p if p.is_absolute() else self.base_dir / p

    @property
    def source_path(self) -> Path:
        return self.resolve(self.recipe.source.path)

    @property
    def target_path(self) -> Path:
        """As written in the recipe; the burnpack writer may still append `.bpk`."""
        return self.resolve(self.recipe.target.path)

    @property
    def template_path(self) -> Path | None:
        template = self.recipe.target.template
        return None if template is None else self.resolve(template)


def load_recipe(path: str | os.PathLike[str]) -> LoadedRecipe:
    """Read, parse and validate a recipe file; raise `RecipeError` listing every problem found."""
    shown = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RECIPE_BYTES + 1)
    except OSError as e:
        raise RecipeError([RecipeIssue(shown, 0, 0, "", f"cannot read the recipe: {e.strerror or e}")]) from None
    absolute = Path(os.path.abspath(path))
    return _load(raw, shown, absolute, absolute.parent)


def parse_recipe(text: str, name: str = "<recipe>", base_dir: Path | None = None) -> LoadedRecipe:
    """Validate an in-memory recipe (`migrate convert --emit-recipe`); paths resolve from `base_dir`."""
    base = Path(os.path.abspath(base_dir if base_dir is not None else os.getcwd()))
    # surrogatepass: a str holding lone surrogates becomes bytes that fail the UTF-8 check with a RecipeError
    return _load(text.encode("utf-8", "surrogatepass"), name, base / name, base)


def recipe_json_schema() -> dict[str, Any]:
    """The JSON Schema of recipe files (validation mode, YAML spellings), for editors and CI."""
    body = Recipe.model_json_schema(by_alias=True, mode="validation")
    body.pop("title", None)
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$comment": f"Generated from migrator/recipe.py; regenerate with: {SCHEMA_REGENERATE}",
        "title": "migrator recipe (version 1)",
        **body,
    }


def recipe_json_schema_text() -> str:
    """The checked-in form of `recipe_json_schema()`: stable key order, 2-space indent, newline."""
    return json.dumps(recipe_json_schema(), indent=2, sort_keys=False, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def _load(raw: bytes, shown: str, path: Path, base_dir: Path) -> LoadedRecipe:
    if len(raw) > MAX_RECIPE_BYTES:
        raise RecipeError([RecipeIssue(shown, 0, 0, "", f"file is larger than {MAX_RECIPE_BYTES // 2**20} MiB",
                                       "a recipe is a few KiB of YAML; is this the right file?")])
    text = _decode(raw, shown)
    root, data, keys, issues = _parse_yaml(text, shown)
    recipe: Recipe | None = None
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        issues.extend(_Mapper(shown, root, keys).issues(e))
    loaded = None
    if recipe is not None:
        loaded = LoadedRecipe(recipe, path, base_dir, text, hashlib.sha256(raw).hexdigest())
        issues.extend(_path_issues(loaded, shown, root, keys))
    if issues or loaded is None:
        raise RecipeError(_sorted_unique(issues))
    return dataclasses.replace(loaded, module_origins=_module_origins(loaded.recipe, shown, root, keys),
                               op_origins=_op_origins(loaded.recipe, shown, root, keys))


def _decode(raw: bytes, shown: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise RecipeError([RecipeIssue(shown, line, col, "", f"not UTF-8 text (byte 0x{raw[e.start]:02x})",
                                       "save the recipe as UTF-8")]) from None


def _yaml_issue(shown: str, e: yaml.YAMLError, text: str) -> RecipeIssue:
    """PyYAML's problem and mark, as one issue (marks are 0-based)."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        problem = e.problem or e.context or "invalid YAML"
        hint = None
        if e.context and e.context_mark is not None and e.problem_mark is not None:
            hint = f"{e.context} at line {e.context_mark.line + 1}, column {e.context_mark.column + 1}"
        indentation = _indentation_hint(e, text)
        if "'\\t'" in problem:
            hint = "indent with spaces; YAML does not allow tabs there"
        elif indentation is not None:
            hint = indentation
        elif problem.startswith("mapping values are not allowed"):
            hint = "quote a value that contains ': '"
        elif e.context == "expected a single document in the stream":
            problem, hint = "a second document starts here", "a recipe is one YAML document"
        elif problem == "second occurrence" and e.context and e.context_mark is not None:
            problem = e.context.removeprefix("found ").split(";")[0]
            hint = f"first defined at line {e.context_mark.line + 1}, column {e.context_mark.column + 1}"
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
        return RecipeIssue(shown, line, col, "", f"invalid YAML: {problem}", hint)
    if isinstance(e, yaml.reader.ReaderError):
        pos = e.position
        line = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        return RecipeIssue(shown, line, col, "", f"invalid YAML: unacceptable character #x{e.character:04x}",
                           "YAML allows printable characters only")
    return RecipeIssue(shown, 0, 0, "", f"invalid YAML: {e}")


def _indentation_hint(e: yaml.MarkedYAMLError, text: str) -> str | None:
    """A hint when PyYAML's problem is really a line indented to the wrong column, else None.

    Two shapes: a line dedented out of its block (PyYAML: "expected <block end>"), and a line
    indented under a `key: value` line, which cannot hold children (PyYAML: "mapping values are
    not allowed here", the same words as for an unquoted ': ' inside a value)."""
    mark, problem = e.problem_mark, e.problem or ""
    if mark is None:
        return None
    if problem.startswith("expected <block end>") and e.context_mark is not None:
        block = e.context_mark
        return (f"check the indentation: line {mark.line + 1} starts at column {mark.column + 1}, the block it "
                f"is in (line {block.line + 1}) at column {block.column + 1}; indent the entries of one "
                "block to the same column, with spaces")
    if not problem.startswith("mapping values are not allowed"):
        return None
    lines = text.splitlines()
    if mark.line >= len(lines):
        return None
    line = lines[mark.line]
    indent = len(line) - len(line.lstrip(" "))
    for above in range(mark.line - 1, -1, -1):
        prev = lines[above]
        body = prev.lstrip(" ")
        if not body or body.startswith("#"):
            continue
        key_col = len(prev) - len(body)
        while body.startswith("- "):  # `- key: value`: the key sits after the dash
            key_col, body = key_col + 2, body[2:].lstrip(" ")
        _, colon, value = body.partition(": ")
        if indent > key_col and colon and value.strip() and not value.lstrip().startswith("#"):
            return (f"check the indentation: line {mark.line + 1} is indented deeper (column {indent + 1}) than "
                    f"the key on line {above + 1} (column {key_col + 1}), which already has a value; align it "
                    "with that key, or end that line with ':' to nest under it")
        return None
    return None


def _parse_yaml(text: str, shown: str) -> tuple[MappingNode, Any, dict[int, Any], list[RecipeIssue]]:
    """Compose, check (size, cycles, duplicate keys, top-level mapping), then construct."""
    try:
        loader = _Loader(text)
    except yaml.YAMLError as e:  # the reader refuses unprintable characters (NUL, ...) up front
        raise RecipeError([_yaml_issue(shown, e, text)]) from None
    try:
        try:
            root = loader.get_single_node()
        except yaml.YAMLError as e:
            raise RecipeError([_yaml_issue(shown, e, text)]) from None
        except RecursionError:
            raise RecipeError([RecipeIssue(shown, 0, 0, "", "invalid YAML: nested too deeply")]) from None
        if root is None:
            raise RecipeError([RecipeIssue(shown, 1, 1, "", "the recipe is empty",
                                           "start with 'version: 1', then source: and target:")])
        scan = _Scan(shown)
        scan.run(root)
        if not isinstance(root, MappingNode):
            raise RecipeError([RecipeIssue(
                shown, root.start_mark.line + 1, root.start_mark.column + 1, "",
                f"the top level must be a mapping, got {_node_kind(root)}",
                "a recipe is a mapping: version: 1, source: {...}, target: {...}")])
        try:
            data = loader.construct_document(root)
        except yaml.YAMLError as e:
            raise RecipeError([_yaml_issue(shown, e, text)]) from None
        except _BadScalar as e:
            raise RecipeError([e.issue(shown, text)]) from None
    finally:
        loader.dispose()
    return root, data, scan.keys, scan.issues


MAX_INT_TEXT = 400
MAX_INT_BITS = 256

_INT_TAG = "tag:yaml.org,2002:int"
_TAG_WORDS = {
    _INT_TAG: "integer",
    "tag:yaml.org,2002:float": "number",
    "tag:yaml.org,2002:bool": "boolean",
    "tag:yaml.org,2002:timestamp": "date",
    "tag:yaml.org,2002:binary": "binary value",
}


class _BadScalar(Exception):
    """A scalar PyYAML resolved (or was told with a tag) to a type whose constructor refused it.

    SafeConstructor raises whatever Python's int/float/datetime/base64 raise (ValueError,
    AttributeError, KeyError, ...) without a mark; this keeps the node so the issue has one."""

    def __init__(self, node: Node, detail: str | None) -> None:
        super().__init__(detail)
        self.node = node
        self.detail = detail

    def issue(self, shown: str, text: str) -> RecipeIssue:
        node, mark = self.node, self.node.start_mark
        word = _TAG_WORDS.get(node.tag, "value")
        raw = node.value if isinstance(node, ScalarNode) else ""
        written = raw if len(raw) <= 40 else raw[:37] + "..."
        message = f"invalid {word} '{written}'" + (f": {self.detail}" if self.detail else "")
        explicit = text.startswith("!", mark.index)
        if explicit:
            hint = f"remove the tag, or write a valid {word}"
        else:
            hint = "quote it to keep it as text" + (f": '{raw}'" if raw == written else "")
        return RecipeIssue(shown, mark.line + 1, mark.column + 1, "", message, hint)


class _Bounded:
    """SafeConstructor with every construction failure tied to its node, and integers bounded.

    Integers are bounded by their text before `int()` runs (a long sexagesimal `1:2:3:...` costs
    quadratic time) and by their size after (no recipe value needs more than 64 bits, and a huge
    integer cannot even be formatted in an error message)."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        if node.tag == _INT_TAG and isinstance(node, ScalarNode) and len(node.value) > MAX_INT_TEXT:
            raise _BadScalar(node, f"more than {MAX_INT_TEXT} characters")
        try:
            data = super().construct_object(node, deep)  # type: ignore[misc]
        except (yaml.YAMLError, _BadScalar, RecursionError):
            raise
        except Exception as e:
            raise _BadScalar(node, _construction_detail(e)) from None
        if type(data) is int and data.bit_length() > MAX_INT_BITS:
            raise _BadScalar(node, f"larger than {MAX_INT_BITS} bits")
        return data


def _construction_detail(e: Exception) -> str | None:
    """Python's own words when they are about the value (not 'NoneType has no attribute')."""
    if isinstance(e, ValueError) and not isinstance(e, UnicodeError):
        text = str(e)
        return text if len(text) <= 80 and "could not convert" not in text and "invalid literal" not in text else None
    return None


class _Constructor(_Bounded, yaml.constructor.SafeConstructor):
    pass


class _Loader(_Bounded, yaml.SafeLoader):
    pass


def _node_kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return f"a scalar ('{node.value}')" if node.value else "an empty document"


class _Scan:
    """One pass over the composed node graph (aliases make it a DAG, or a cycle).

    Bounds the size of the tree the aliases expand to, rejects cycles, reports duplicate keys and
    records each scalar key's constructed value so error paths can be matched to key nodes.
    """

    def __init__(self, shown: str) -> None:
        self.shown = shown
        self.keys: dict[int, Any] = {}
        self.issues: list[RecipeIssue] = []
        self._constructor = _Constructor()
        self._nonstring_keys = 0

    def run(self, root: Node) -> None:
        sizes: dict[int, int] = {}
        on_stack: set[int] = set()
        # (node, path, children done?) -- iterative post-order, so deep documents cannot overflow.
        stack: list[tuple[Node, tuple[Any, ...], bool]] = [(root, (), False)]
        while stack:
            node, path, done = stack.pop()
            nid = id(node)
            if done:
                on_stack.discard(nid)
                sizes[nid] = 1 + sum(sizes[id(c)] for c in _children(node))
                if sizes[nid] > MAX_YAML_NODES:
                    self._fail(node, f"the recipe expands to more than {MAX_YAML_NODES:,} YAML nodes",
                               "aliases (*name) repeat what they point to; a recipe is small")
                continue
            if nid in sizes:
                continue
            if nid in on_stack:
                self._fail(node, "an alias refers to a node that contains it (recursive YAML)", None)
            on_stack.add(nid)
            stack.append((node, path, True))
            if isinstance(node, MappingNode):
                self._mapping(node, path)
                for key, value in reversed(node.value):
                    stack.append((value, (*path, self.keys.get(id(key), key.value)), False))
                    stack.append((key, path, False))
            elif isinstance(node, SequenceNode):
                for i in range(len(node.value) - 1, -1, -1):
                    stack.append((node.value[i], (*path, i), False))
            elif isinstance(node, ScalarNode) and _SURROGATE.search(node.value):
                self._fail(node, "text holds a lone surrogate escape (such as \\ud800), which is not Unicode",
                           "write the character itself, or a \\U escape of a real code point")

    def _fail(self, node: Node, message: str, hint: str | None) -> None:
        mark = node.start_mark
        raise RecipeError([RecipeIssue(self.shown, mark.line + 1, mark.column + 1, "", message, hint)])

    def _mapping(self, node: MappingNode, path: tuple[Any, ...]) -> None:
        seen: dict[Any, Node] = {}
        for key, _ in node.value:
            if key.tag == _MERGE_TAG or not isinstance(key, ScalarNode):
                continue
            if key.tag != _STR_TAG:
                self._nonstring_keys += 1
                if self._nonstring_keys > MAX_NONSTRING_KEYS:
                    shown = key.value if len(key.value) <= 40 else key.value[:37] + "..."
                    self._fail(key, f"keys must be strings, got {shown}; the recipe has more than "
                               f"{MAX_NONSTRING_KEYS} keys that are not", "a recipe's keys are names: quote them")
            try:
                value = self._constructor.construct_object(key, deep=True)
            except Exception:  # a malformed key scalar; construction reports it with its mark
                continue
            self.keys[id(key)] = value
            try:  # equal as dict keys (1, 1.0, true) is what PyYAML's dict would merge
                first = seen.setdefault(value, key)
            except TypeError:  # unhashable; construction reports it
                continue
            if first is not key:
                self.issues.append(RecipeIssue(
                    self.shown, key.start_mark.line + 1, key.start_mark.column + 1, _render_loc((*path, value)),
                    f"duplicate key '{key.value}'",
                    f"first given at line {first.start_mark.line + 1}; YAML would silently keep the last"))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _children(node: Node) -> Iterator[Node]:
    if isinstance(node, MappingNode):
        for key, value in node.value:
            yield key
            yield value
    elif isinstance(node, SequenceNode):
        yield from node.value


# ---------------------------------------------------------------------------------------------
# Paths through the model's types
# ---------------------------------------------------------------------------------------------


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional: neither adds a level to pydantic's error locations."""
    while True:
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


# ---------------------------------------------------------------------------------------------
# Errors -> issues
# ---------------------------------------------------------------------------------------------


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
        if any(_unwrap(m) is HalfPrecisionAdapter for m in members):
            return self._adapter_issue(path, node, value)
        expected = _describe_type(union)
        hint = None
        if isinstance(value, str):
            guess = did_you_mean(value, _literal_strings(union))
            hint = f"did you mean '{guess}'?" if guess else None
        return _Issue(path, node, f"expected {expected}, got {_describe_value(value, node)}", hint)

    def _adapter_issue(self, path: tuple[Any, ...], node: Node | None, value: Any) -> _Issue:
        valid = "valid adapters: " + ", ".join(_ADAPTER_SPELLINGS)
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
        guess = did_you_mean(name, list(_ADAPTER_NAMES)) if isinstance(name, str) else None
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
            hint = _field_description(e.owner, name)
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
        if kind in ("value_error", "assertion_error"):
            return [self._value_error(e)]
        if kind == NO_MEMBER:  # a union's discriminator found no member of that shape
            return [self._union_issue(data, _unwrap(e.tp))]
        node, _, _ = self._locate(data)
        if kind == "literal_error":
            options = _literal_strings(e.tp)
            expected = _join_or([f"'{o}'" for o in options]) if options else str(raw.get("ctx", {}).get("expected"))
            guess = did_you_mean(value, options) if isinstance(value, str) else None
            hint = f"did you mean '{guess}'?" if guess else None
            return [_Issue(data, node, f"expected {expected}, got {_describe_value(value, node)}", hint)]
        expected = _EXPECTED.get(kind)
        if expected is None:
            return [_Issue(data, node, str(raw.get("msg", kind)))]
        if kind in ("model_type", "model_attributes_type", "dict_type") and _is_model(_unwrap(e.tp)):
            hint: str | None = f"valid keys: {', '.join(_yaml_keys(_unwrap(e.tp)))}"
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
        cause = e.raw.get("ctx", {}).get("error")
        data = e.data
        if isinstance(cause, RecipeValueError):
            if cause.key is not None:
                data = (*data, cause.key)
            node, _, found = self._locate(data)
            if not found:
                node, _, _ = self._locate(e.data)
                data = e.data
            return _Issue(data, node, cause.message, cause.hint)
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


# ---------------------------------------------------------------------------------------------
# Wording
# ---------------------------------------------------------------------------------------------

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

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


def _render_loc(data: Sequence[Any]) -> str:
    """`target.metadata['a.b']`, `remap[0].from`: the path as the user would point at it."""
    out: list[str] = []
    for seg in data:
        if seg == "[key]":
            continue
        if type(seg) is int:
            out.append(f"[{seg}]")
        elif isinstance(seg, str) and _PLAIN_KEY.match(seg):
            out.append(f".{seg}" if out else seg)
        else:
            out.append(f"[{_quote_key(seg)}]")
    return "".join(out)


def _quote_key(key: Any) -> str:
    return f"'{key}'" if isinstance(key, str) else _yaml_scalar(key)


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


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
            alternatives.append("a mapping such as {epoch: {int: 42}}" if value is ScalarValue else "a mapping")
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


# ---------------------------------------------------------------------------------------------
# Checks beyond the model
# ---------------------------------------------------------------------------------------------


def _path_issues(loaded: LoadedRecipe, shown: str, root: MappingNode, keys: dict[int, Any]) -> list[RecipeIssue]:
    """The output must not be a file the run reads (the run would destroy its own input)."""
    mapper = _Mapper(shown, root, keys)
    target = loaded.target_path
    outputs = _written_candidates(target, loaded.recipe.target.format)
    issues: list[RecipeIssue] = []
    checks = [("source.path", loaded.source_path)]
    if loaded.template_path is not None:
        checks.append(("target.template", loaded.template_path))
    for what, read in checks:
        if any(_same_file(out, cand) for out in outputs for cand in _read_candidates(read)):
            node, _, _ = mapper._locate(("target", "path"))
            issues.append(mapper._render(_Issue(("target", "path"), node,
                                                f"the target is the same file as {what}",
                                                "write the output to a new file")))
    return issues


def _written_candidates(path: Path, fmt: str) -> list[Path]:
    """The burnpack writer appends `.bpk` to an extension-less path."""
    out = [path]
    if fmt in ("auto", "burnpack") and not os.path.splitext(path.name)[1]:
        out.append(path.with_name(path.name + ".bpk"))
    return out


def _read_candidates(path: Path) -> list[Path]:
    """Burn's reader: an extension-less path that does not exist may mean `path.bpk`."""
    out = [path]
    if not os.path.splitext(path.name)[1]:
        out.append(path.with_name(path.name + ".bpk"))
    return out


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _module_origins(recipe: Recipe, shown: str, root: MappingNode, keys: dict[int, Any]) -> dict[tuple[str, int], str]:
    """Where each `modules:` regex is written, so a plan's misfit error can name the recipe line."""
    mapper = _Mapper(shown, root, keys)
    out: dict[tuple[str, int], str] = {}
    for type_name, patterns in recipe.modules.items():
        for i in range(len(patterns)):
            node, _, found = mapper._locate(("modules", type_name, i))
            if found:
                issue = mapper._render(_Issue((), node, ""))
                out[(type_name, i)] = f"{issue.file}:{issue.line}:{issue.col}"
    return out


def _op_origins(recipe: Recipe, shown: str, root: MappingNode, keys: dict[int, Any]
                ) -> dict[tuple[int, str], tuple[str, int, int]]:
    """Where each `ops:` entry (key '') and each of its keys is written: an op's shape errors come from the plan."""
    from .recipe_ops import op_kind_and_spec

    mapper = _Mapper(shown, root, keys)
    out: dict[tuple[int, str], tuple[str, int, int]] = {}
    for i, op in enumerate(recipe.ops):
        kind, spec = op_kind_and_spec(op)
        for key in ("", *(f.alias or name for name, f in type(spec).model_fields.items())):
            node, key_node, found = mapper._locate(("ops", i, kind, key) if key else ("ops", i))
            if found:  # at the key: what the message is about (a flow-style value's mark is its ':')
                issue = mapper._render(_Issue((), key_node or node, ""))
                out[(i, key)] = (issue.file, issue.line, issue.col)
    return out


def locate(loaded: LoadedRecipe, data: tuple[Any, ...], shown: str | None = None) -> str | None:
    """'recipe.yaml:LINE:COL' of the value at `data` (e.g. ("source", "top_level_key")), for an error
    found after loading (when planning) that is about one recipe value; None when it is not written.
    `shown`: the recipe's path as the user gave it (default: the loaded path)."""
    shown = shown or str(loaded.path)
    try:
        root, _, keys, _ = _parse_yaml(loaded.text, shown)
    except RecipeError:
        return None
    mapper = _Mapper(shown, root, keys)
    node, _, found = mapper._locate(data)
    if not found:
        return None
    issue = mapper._render(_Issue((), node, ""))
    return f"{issue.file}:{issue.line}:{issue.col}"

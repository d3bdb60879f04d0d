"""Recipe YAML: decoded, composed and constructed with PyYAML's SafeLoader, bounded and marked.

PyYAML keeps the last of duplicate keys silently, so duplicates are found on the node tree;
aliases are allowed but the expanded tree is bounded (billion laughs), integers are bounded by
their text and size, and every problem carries the line and column of its node.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .issues import RecipeError, RecipeIssue, _render_loc

MAX_YAML_NODES = 100_000
# Keys that are not strings are always an error (every mapping of a recipe is keyed by names), but
# ints, floats, bools and null hash predictably: thousands of keys that collide (multiples of
# 2**61-1 all hash to 0) make building a dict quadratic. Past this many the loader stops, before
# any dict holding them is built.
MAX_NONSTRING_KEYS = 100
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"


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
        elif mark is not None and "${" in (text.splitlines()[mark.line:mark.line + 1] or [""])[0]:
            hint = "inside { } quote a ${config...} value: heads: '${config.num_attention_heads}'"
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

"""YAML from untrusted files (NeMo 2's `context/model.yaml`), bounded before and after parsing.

PyYAML's SafeLoader builds only plain data (no tag names a Python class), but an alias repeats the
node it names, so a few lines of nested aliases expand to billions of nodes ("billion laughs"), and a
long integer or sexagesimal literal costs quadratic time to convert. So: the text is capped in bytes,
the composed node graph is walked once (without recursion) counting the tree the aliases expand to and
refusing cycles, integers are capped by their text, and only then is the document constructed. The
recipe loader (`recipe.yaml_nodes`) bounds recipes the same way, with line-and-column issues of its own.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..core.errors import FormatError

MAX_NODES = 200_000
"""Nodes a document may expand to, aliases repeated (a NeMo model.yaml has a few hundred)."""
MAX_INT_TEXT = 400
_INT_TAG = "tag:yaml.org,2002:int"


class _Loader(yaml.SafeLoader):
    def construct_object(self, node: Node, deep: bool = False) -> Any:
        if node.tag == _INT_TAG and isinstance(node, ScalarNode) and len(node.value) > MAX_INT_TEXT:
            raise yaml.constructor.ConstructorError(None, None, f"an integer of more than {MAX_INT_TEXT} characters",
                                                    node.start_mark)
        return super().construct_object(node, deep)


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def _expanded_size(root: Node, label: str) -> int:
    """The number of nodes `root` expands to with every alias repeated; refuses a cycle and, as soon as
    it is passed, `MAX_NODES`."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if done:
            on_path.discard(nid)
            sizes[nid] = 1 + sum(sizes[id(c)] for c in _children(node))
            if sizes[nid] > MAX_NODES:
                raise FormatError(f"the YAML expands to more than {MAX_NODES:,} nodes (aliases repeat what they name)",
                                  file=label)
            continue
        if nid in sizes:
            continue
        if nid in on_path:
            raise FormatError("an alias refers to a node that contains it (recursive YAML)", file=label)
        on_path.add(nid)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    return sizes[id(root)]


def load_bounded_yaml(raw: bytes, label: str) -> Any:
    """The document in `raw` as plain data (dicts, lists, strings, numbers, booleans, None, dates);
    FormatError naming `label` for text that is not UTF-8, not YAML, or past the bounds above."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise FormatError(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})", file=label) from None
    try:
        loader = _Loader(text)
    except yaml.YAMLError as e:
        raise FormatError(f"not YAML: {_one_line(e)}", file=label) from None
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _expanded_size(root, label)
        return loader.construct_document(root)
    except yaml.YAMLError as e:
        raise FormatError(f"not YAML: {_one_line(e)}", file=label) from None
    except RecursionError:
        raise FormatError("the YAML is nested too deeply", file=label) from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):  # a scalar its constructor refused
        raise FormatError("not YAML: a value cannot be read (an invalid date, number or binary)", file=label) from None
    finally:
        loader.dispose()


def _one_line(e: yaml.YAMLError) -> str:
    if isinstance(e, yaml.MarkedYAMLError) and e.problem:
        mark = e.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{e.problem}{where}"
    return " ".join(str(e).split())

"""A checkpoint's nested state dict flattened into DCP's keys, as `dcp.save` flattens it.

torch's `flatten_state_dict` (`_traverse.traverse_state_dict`, torch >= 2.4) walks every mapping,
naming each key `str(key)`; a list is walked by index only when something inside it is a mapping, a
tensor, or such a list; any other value (a tuple, a list of plain values, a number, a string) is one
leaf, stored as bytes. The key is the path joined by dots (`optim.param_groups.0.lr`) and the path is
kept in `planner_data`, so `dcp_to_torch_save` rebuilds the same nesting. An empty dict has no leaf:
torch drops it too.
"""

from __future__ import annotations

from typing import Any

from ...core.errors import PlanError
from ..pytorch.tree import Node, TensorSlot
from .items import MAX_VALUE_DEPTH

Path = tuple[str | int, ...]
Leaf = tuple[Path, str | None, Any]
"""A key's path, the tensor there (its name in the writer's tensors) or None, and else the plain value."""


def flatten(root: Node) -> list[Leaf]:
    """The leaves of the structure `root` (a dict), in torch's order."""
    if not root.is_dict:
        raise PlanError(f"a DCP checkpoint's state dict is a dict; this structure is a {root.kind}")
    out: list[Leaf] = []
    stack: list[tuple[Node, Path, Any]] = [(root, (), iter(root.items()))]
    while stack:
        node, path, it = stack[-1]
        for key, value in it:
            here: Path = (*path, str(key) if node.is_dict else key)
            if isinstance(value, TensorSlot):
                out.append((here, value.name, None))
                continue
            if isinstance(value, Node) and (value.is_dict or (value.kind == "list" and _walked(value))):
                stack.append((value, here, iter(value.items())))
                break
            if isinstance(value, Node) and value.tensors:
                raise PlanError(f"'{'.'.join(map(str, here))}' is a {value.kind} holding tensors: DCP stores it as one "
                                "pickled value, which migrator does not write (make it a list or a dict)")
            out.append((here, None, plain(value, '.'.join(map(str, here)))))
        else:
            stack.pop()
    return out


def _walked(node: Node) -> bool:
    """torch's `not _is_terminal(list)`: a mapping or a tensor inside it, or inside a list in it."""
    todo = [node]
    while todo:
        for v in todo.pop().values:
            if isinstance(v, TensorSlot) or (isinstance(v, Node) and v.is_dict):
                return True
            if isinstance(v, Node) and v.kind == "list":
                todo.append(v)
    return False


def plain(value: Any, name: str, depth: int = 0) -> Any:
    """A leaf as the Python value torch would pickle: containers made lists, tuples and dicts again."""
    if not isinstance(value, Node):
        return value
    if depth > MAX_VALUE_DEPTH:
        raise PlanError(f"a value nested more than {MAX_VALUE_DEPTH} deep", tensor=name)
    if value.is_dict:
        return {k: plain(v, name, depth + 1) for k, v in zip(value.keys, value.values, strict=True)}
    items = [plain(v, name, depth + 1) for v in value.values]
    return tuple(items) if value.kind == "tuple" else items

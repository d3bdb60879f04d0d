"""The nested state dict a DCP checkpoint flattens, rebuilt as a `CheckpointTree` for a `.pt` target.

`planner_data` gives each flattened key its path (`("optim", "param_groups", 0, "lr")`); torch's
`dcp_to_torch_save` puts every value along its path in `state_dict_metadata` order, making a dict
for a name and a list for an index (a list grows with None up to the index). The same walk here
gives the tree the PyTorch writer writes back, with each tensor's slot in the order the reader
lists its tensors.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from ...core.errors import FormatError, LimitExceededError
from ...core.limits import Limits
from ..pytorch.tree import SOURCE_SLOT, CheckpointTree, Node, is_plain
from .metadata import DcpMetadata

_SHOWN = 1000


class _Tensor:
    """A tensor's place while the nested dict is built."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _set(root: dict[Any, Any], path: tuple[str | int, ...], value: Any, label: str, name: str) -> None:
    """torch's `set_element`: containers made along the path (a dict for a name, a list for an index)."""
    cur: Any = root
    for prev, key in pairwise(path):
        fresh: Any = {} if type(key) is str else []
        if isinstance(cur, dict):
            cur = cur.setdefault(prev, fresh)
        elif isinstance(cur, list) and type(prev) is int:
            cur.extend([None] * (prev + 1 - len(cur)))
            if cur[prev] is None:
                cur[prev] = fresh
            cur = cur[prev]
        else:
            raise FormatError("planner_data paths disagree about the containers on this key's path", file=label,
                              tensor=name)
        if not isinstance(cur, (dict, list)):
            raise FormatError("planner_data puts this key inside another key's value", file=label, tensor=name)
    key = path[-1]
    if isinstance(cur, list) and type(key) is int:
        cur.extend([None] * (key + 1 - len(cur)))
        cur[key] = value
    elif isinstance(cur, dict):
        cur[key] = value
    else:
        raise FormatError("planner_data paths disagree about the containers on this key's path", file=label,
                          tensor=name)


def build_tree(meta: DcpMetadata, values: dict[str, Any], label: str,
               limits: Limits) -> tuple[CheckpointTree, list[str]]:
    """The checkpoint's tree and its tensors' names in the tree's slot order."""
    nested: dict[Any, Any] = {}
    for name in meta.order:
        path = meta.paths.get(name, (name,))
        if len(path) > limits.max_nesting:
            raise LimitExceededError(f"planner_data path nested {len(path)} deep (max_nesting)", file=label,
                                     tensor=name)
        value = _Tensor(name) if name in meta.tensors else values.get(name)
        _set(nested, path, value, label, name)
    tree = CheckpointTree(Node("dict"))
    order: list[str] = []
    kept: dict[str, None] = {}
    visits = 0
    stack: list[tuple[Node, str, Any]] = [(tree.root, "", iter(nested.items()))]
    while stack:
        node, where, it = stack[-1]
        for key, value in it:
            visits += 1
            if visits > limits.max_nodes:
                raise LimitExceededError(f"more than {limits.max_nodes} values in the checkpoint structure "
                                         "(max_nodes)", file=label)
            name = f"{where}.{key}" if where else str(key)
            if isinstance(value, _Tensor):
                _add(node, key, SOURCE_SLOT)
                node.tensors = True
                order.append(value.name)
                continue
            if isinstance(value, (dict, list, tuple)):
                if isinstance(value, dict) and not all(type(k) in (str, int) for k in value):
                    tree.dropped_count += 1
                    if len(tree.dropped) < _SHOWN:
                        tree.dropped.append(name)
                    continue
                kind = "dict" if isinstance(value, dict) else "list" if isinstance(value, list) else "tuple"
                child = Node(kind)  # type: ignore[arg-type]
                _add(node, key, child)
                items = value.items() if isinstance(value, dict) else enumerate(value)
                stack.append((child, name, iter(items)))
                break
            if is_plain(value):
                _add(node, key, value)
                tree.kept_count += 1
                if len(kept) < _SHOWN:
                    kept[name] = None
            else:
                tree.dropped_count += 1
                if len(tree.dropped) < _SHOWN:
                    tree.dropped.append(name)
        else:
            done = stack.pop()[0]
            if done.tensors and stack:
                stack[-1][0].tensors = True
    tree.kept = list(kept)
    return tree, order


def _add(node: Node, key: Any, value: Any) -> None:
    if node.is_dict:
        node.keys.append(key)
    node.values.append(value)

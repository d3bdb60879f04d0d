"""A checkpoint's structure, kept so that a PyTorch -> PyTorch run writes it back with only tensor keys renamed.

A training checkpoint is more than a state_dict: `{"model": sd, "optimizer": {"state": {0: {...}},
"param_groups": [...]}, "epoch": 3, "args": {...}}`. The reader flattens it into named tensors (the
plan works on those names); opened with `keep_structure=True` (the plan does so for a PyTorch
target), it also records the containers around them (`describe_tree`), as plain data:

* `Node`: a dict, OrderedDict, list or tuple, with its keys as stored (strings, or ints such as an
  optimizer's parameter ids) and its values in order; an OrderedDict's `_metadata` (module
  versions, set by BUILD) is kept when it is plain data;
* `TensorSlot`: where a tensor goes, by its flattened name (`model.layers.0.weight` for
  `ckpt["model"]["layers.0.weight"]`);
* None, bools, 64-bit ints, floats and strings as themselves.

Nothing from the pickle is kept: no placeholder, no `TensorRef`; what the tree cannot hold (numpy
arrays, devices, objects of unknown classes, non-string keys) is listed in `dropped`. The walk is
bounded like the flattening that ran before it (`max_nodes` values, `max_nesting` levels; that walk
refused cycles already). A flat state_dict (a dict of tensors and nothing else) has no tree: the
writer's flat OrderedDict is that structure already.

`place_tensors` is the plan's side: it gives each slot its tensor's target name (after remaps,
filters, ops) and the key that name implies inside the slot's container, refusing a rename that
leaves the container (the key would move between dicts, which `load_state_dict` would not see), unless
the rename moves a whole dict's tensors into one new dict at the same depth: then the dict is renamed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ...core.errors import LimitExceededError, PlanError
from ...core.limits import Limits
from ..base import utf8_ok
from ..safepickle import values as sp

NodeKind = Literal["dict", "odict", "list", "tuple"]
Plain = None | bool | int | float | str
_INT64, _UINT64 = 1 << 63, 1 << 64
_SHOWN = 1000  # names kept for a note (counts are exact)


@dataclass(slots=True)
class TensorSlot:
    """A tensor's place in the structure. In a reader's tree every slot is `SOURCE_SLOT` (the k-th slot
    in walk order is the reader's k-th tensor: the flattening walks the same way), with None as its key
    in a dict when the key is the end of the tensor's name: per tensor, a tree costs two list entries.
    In a placed tree (`place_tensors`), each slot names its output tensor and keys are real."""

    name: str


SOURCE_SLOT = TensorSlot("")


@dataclass(slots=True, eq=False)
class Node:
    """One container: `keys` (dict kinds only: each key as stored, str or int) and `values` in order.
    Its dotted name is not stored (a hostile pickle's deep paths would add up): walks build it."""

    kind: NodeKind
    keys: list[str | int | None] = field(default_factory=list)  # None: a tensor's key, from its name
    values: list[Node | TensorSlot | Plain] = field(default_factory=list)
    attrs: dict[str, Any] | None = None  # an OrderedDict's `_metadata`, plain data only
    tensors: bool = False  # whether a tensor slot is inside: a Node without is shared where the pickle shares it

    @property
    def is_dict(self) -> bool:
        return self.kind in ("dict", "odict")

    def items(self) -> Iterator[tuple[str | int | None, Node | TensorSlot | Plain]]:
        """(key, value): a dict's keys, a list's or tuple's indices."""
        return zip(self.keys, self.values, strict=True) if self.is_dict else enumerate(self.values)


@dataclass
class CheckpointTree:
    """The structure of a whole checkpoint: `root`, the non-tensor values kept (`kept`, dotted paths,
    values inside lists/tuples counted under the list's path) and those that cannot be written back
    (`dropped`)."""

    root: Node
    kept: list[str] = field(default_factory=list)
    kept_count: int = 0
    dropped: list[str] = field(default_factory=list)
    dropped_count: int = 0


def _key_text(key: Any) -> str | None:
    """A dict key as a name segment: strings, and integers that print (str() of a 4 KiB one raises)."""
    if type(key) is str:
        return key
    if type(key) is int and -_INT64 <= key < _INT64:
        return str(key)
    return None


def is_plain(value: Any) -> bool:
    """A value a checkpoint's structure keeps as it is: None, bool, float, a 64-bit int, UTF-8 text."""
    t = type(value)
    if value is None or t is bool or t is float:
        return True
    if t is int:
        return -_INT64 <= value < _UINT64
    return t is str and utf8_ok(value)


def _kind(value: Any) -> NodeKind:
    if isinstance(value, sp.ODict):
        return "odict"
    return "dict" if isinstance(value, dict) else "list" if isinstance(value, list) else "tuple"


def _pairs(value: Any) -> Iterator[tuple[Any, Any]]:
    return iter(value.items()) if isinstance(value, dict) else enumerate(value)


def _module_versions(value: Any) -> dict[str, Any] | None:
    """A state_dict's `_metadata` ({module prefix: {"version": 1}}) when it is that plain data."""
    attrs = getattr(value, "_attrs", None)
    meta = attrs.get("_metadata") if attrs else None
    if not isinstance(meta, dict) or len(meta) > 1_000_000:
        return None
    for k, v in meta.items():
        if type(k) is not str or not utf8_ok(k) or not isinstance(v, dict) or len(v) > 100:
            return None
        if not all(type(vk) is str and utf8_ok(vk) and is_plain(vv) for vk, vv in v.items()):
            return None
    return {"_metadata": meta}


def is_ordered_dict(value: Any) -> bool:
    """Whether a dict kept in the tree (a `_metadata`) was pickled as an OrderedDict, for the writer."""
    return isinstance(value, sp.ODict)


def is_flat(root: Any) -> bool:
    """A dict of string keys to tensors: the flat OrderedDict the writer writes is its structure."""
    return (isinstance(root, dict) and all(type(v) is sp.TensorRef for v in root.values())
            and all(type(k) is str for k in root))


_Frame = tuple[Node, str, Iterator[tuple[Any, Any]], str | None, int, int, int]
"""`describe_tree`'s walk: node, its path, its items, the enclosing list's path, the container's id, and the
plain and dropped counts when it was entered."""


def describe_tree(root: Any, limits: Limits, label: str) -> CheckpointTree | None:
    """The structure around the tensors of a whole checkpoint, or None for a flat state_dict.
    Runs after `Flattener._flatten`, which refused cycles, unsupported tensors and placeholders."""
    if is_flat(root) or not isinstance(root, (dict, list, tuple)):
        return None
    top = Node(_kind(root), attrs=_module_versions(root))
    tree = CheckpointTree(top)
    kept: dict[str, None] = {}  # ordered set of the paths shown
    # a container without tensors that the pickle shares (memo) is one Node, kept once: id -> (Node, the
    # plain values and the dropped ones it holds), so a memo bomb of plain values costs its distinct objects
    shared: dict[int, tuple[Node, int, int]] = {}
    stack: list[_Frame] = [(top, "", _pairs(root), None, id(root), 0, 0)]
    visits = 0
    while stack:
        node, path, it, in_list = stack[-1][:4]
        for key, value in it:
            visits += 1
            if visits > limits.max_nodes:
                raise LimitExceededError(f"more than {limits.max_nodes} values in the checkpoint structure "
                                         "(max_nodes)", file=label)
            if type(value) is sp.TensorRef and (type(key) is str or not node.is_dict):  # named as the reader did
                if node.is_dict:
                    node.keys.append(None)  # not the pickle's key object: see `Flattener._flatten`
                node.values.append(SOURCE_SLOT)
                node.tensors = True
                continue
            text = _key_text(key) if node.is_dict else str(key)
            if text is None or not utf8_ok(text):
                tree.dropped_count += 1
                if len(tree.dropped) < _SHOWN:
                    tree.dropped.append(f"{path}.<non-string key>" if path else "<non-string key>")
                continue
            name = f"{path}.{text}" if path else text
            child: Node | TensorSlot | Plain
            again = shared.get(id(value)) if isinstance(value, (dict, list, tuple)) else None
            if type(value) is sp.TensorRef:  # under an int key
                child = SOURCE_SLOT
                node.tensors = True
            elif again is not None:
                child = again[0]
                tree.kept_count += again[1]
                tree.dropped_count += again[2]
            elif isinstance(value, (dict, list, tuple)):
                child = Node(_kind(value), attrs=_module_versions(value))
            elif is_plain(value):
                child = value
                tree.kept_count += 1
                if len(kept) < _SHOWN:
                    kept[in_list or name] = None
            else:
                tree.dropped_count += 1
                if len(tree.dropped) < _SHOWN:
                    tree.dropped.append(name)
                continue
            if node.is_dict:
                node.keys.append(key)
            node.values.append(child)
            if isinstance(child, Node) and again is None:
                inner = in_list or (name if child.kind in ("list", "tuple") else None)
                stack.append((child, name, _pairs(value), inner, id(value), tree.kept_count, tree.dropped_count))
                break
        else:
            done, _, _, _, oid, kept0, dropped0 = stack.pop()
            if done.tensors and stack:
                stack[-1][0].tensors = True
            elif not done.tensors:
                shared[oid] = (done, tree.kept_count - kept0, tree.dropped_count - dropped0)
    tree.kept = list(kept)
    return tree


# ---------------------------------------------------------------------------------------------------
# the plan's side


@dataclass
class Placed:
    """The structure with each slot named as its output tensor, and what the plan should say about it."""

    root: Node
    notes: list[str]


def place_tensors(tree: CheckpointTree, names: Sequence[str], moves: Sequence[tuple[str, str]],
                  label: str, swap: Mapping[str, tuple[Node | None, int]] | None = None) -> Placed:
    """Give every slot its output tensor: `names` are the reader's tensor names (the k-th is the k-th
    slot's), `moves` the (source name, target name) of the plan's entries. A slot whose tensor is not
    written (a filter) is left out; a rename keeps the tensor in its own container, with the key its new
    name gives there. Refused (PlanError naming the key): a rename that leaves its container or renames
    a list element, a list element made into several outputs, an output made from no slot, two keys
    that collide. Outputs of ops go where their source was (a split's parts all there; a concat's where
    its first input was: the other inputs are left out). `swap`: dotted path -> (a placed container to put
    there instead, or None to leave the key out; the tensor slots the source's container holds): an
    optimizer rebuilt for the output (`plan.training`)."""
    targets: dict[str, list[str]] = {}  # a split makes several outputs of one source: all go where it was
    for src, dst in moves:
        targets.setdefault(src, []).append(dst)
    placed: set[str] = set()
    left_out: list[str] = []
    renamed: dict[str, str] = {}  # old key or name -> new name, to find what still refers to old names
    touched: list[tuple[Node, str]] = []  # containers with a renamed key (and path): checked for collisions
    versions_dropped: list[str] = []
    moved = _moved_containers(tree, names, targets, swap or {})
    slots = iter(names)
    root = Node(tree.root.kind, attrs=tree.root.attrs, tensors=True)
    # (source container, its path, its items, the output container, the output's path)
    stack: list[tuple[Node, str, Iterator[tuple[Any, Any]], Node, str]] = [
        (tree.root, "", tree.root.items(), root, "")]
    while stack:
        old, path, it, new, out_path = stack[-1]
        for key, value in it:
            if swap and isinstance(value, Node) and (at := f"{path}.{key}" if path else str(key)) in swap:
                replacement, held = swap[at]
                for _ in range(held):  # its slots are the replacement's business
                    next(slots, None)
                if replacement is not None:
                    _add(new, key, replacement)
                continue
            if isinstance(value, Node) and not value.tensors:  # nothing in it changes: the same Node
                _add(new, key, value)
                continue
            if isinstance(value, Node):
                child = Node(value.kind, attrs=value.attrs, tensors=True)
                at = f"{path}.{key}" if path else str(key)
                to = moved.get(at)
                if to is None:
                    to = f"{out_path}.{key}" if out_path else str(key)
                else:  # renamed whole: the same container under its new key
                    touched.append((new, out_path))
                    key = to[len(out_path) + 1:] if out_path else to
                _add(new, key, child)
                stack.append((value, at, value.items(), child, to))
                break
            if not isinstance(value, TensorSlot):
                _add(new, key, value)
                continue
            name = next(slots, None)
            prefix = f"{path}." if path else ""
            if name is None or not name.startswith(prefix):
                raise PlanError("the checkpoint's structure and its tensors disagree (a bug): write SafeTensors, "
                                "or use --top-level-key", file=label, tensor=name)
            if key is None:
                key = name[len(prefix):]
            outputs = targets.get(name)
            if outputs is None:
                left_out.append(name)
                continue
            placed.add(name)
            out_prefix = f"{out_path}." if out_path else ""
            if len(outputs) > 1 and not old.is_dict:
                raise PlanError(f"'{name}' becomes {', '.join(repr(o) for o in outputs[:5])}: it is element {key} of "
                                f"the {old.kind} '{path}', which has one place for it; write SafeTensors, or pick a "
                                "part with --top-level-key (top_level_key) for a flat state_dict", file=label,
                                tensor=name)
            for target in outputs:
                new_key = key
                if target != name:
                    renamed[name] = target
                if target != out_prefix + str(key):
                    new_key = _new_key(old, path, out_path, key, name, target, label)
                    renamed[name[len(prefix):]] = target
                    if not touched or touched[-1][0] is not new:
                        touched.append((new, path))
                        if new.attrs is not None:  # module prefixes that no longer match the keys
                            new.attrs = None
                            versions_dropped.append(path or "the top level")
                _add(new, new_key, TensorSlot(target))
        else:
            stack.pop()
    if next(slots, None) is not None:
        raise PlanError("the checkpoint's structure and its tensors disagree (a bug): write SafeTensors, or use "
                        "--top-level-key", file=label)
    unplaced = [dst for src, dst in moves if src not in placed]
    if unplaced:
        raise PlanError(f"'{unplaced[0]}' has no place in the checkpoint's structure (made by an op from several "
                        "tensors?); write SafeTensors, or pick a part with --top-level-key (top_level_key) for a "
                        "flat state_dict", file=label, tensor=unplaced[0])
    for node, path in touched:
        _refuse_collisions(node, path, label)
    notes = _notes(tree, root, left_out, renamed)
    if versions_dropped:
        notes.append(f"module versions (state_dict _metadata) not kept for {_shown(versions_dropped)}: keys there "
                     "were renamed (load_state_dict then takes every module to be of the current version)")
    return Placed(root, notes)


def _new_key(node: Node, path: str, out_path: str, key: str | int, name: str, target: str,
             label: str) -> str | int:
    """The key `target` names inside `node` (named `path`, written at `out_path`); PlanError when it
    leaves the container."""
    prefix = f"{out_path}." if out_path else ""
    if not node.is_dict:
        raise PlanError(f"'{name}' -> '{target}': '{name}' is element {key} of the {node.kind} '{path}', "
                        "which has no names to rename; keep its name", file=label, tensor=name)
    if not target.startswith(prefix) or len(target) == len(prefix):
        where = f"'{path}'" if path else "the top level"
        raise PlanError(f"'{name}' -> '{target}' moves the tensor out of its dict {where}: a PyTorch -> PyTorch run "
                        f"keeps the checkpoint's structure and renames keys inside their dicts only (so "
                        f"load_state_dict still finds them), or a whole dict into one new dict; rename within {where} "
                        f"(target names starting '{prefix}'), or every key of it alike, or pick that part with "
                        "--top-level-key (top_level_key) for a flat state_dict, or write SafeTensors", file=label,
                        tensor=name)
    new = target[len(prefix):]
    return key if type(key) is int and new == str(key) else new


def _moved_containers(tree: CheckpointTree, names: Sequence[str], targets: Mapping[str, list[str]],
                      swap: Mapping[str, tuple[Node | None, int]]) -> dict[str, str]:
    """Containers renamed whole: source path -> output path. A dict's value (`ckpt["model"]`) whose every
    written tensor is renamed under one new key of the same dict, at the same depth (`^model\\.` ->
    `net.`: `model.0.weight` -> `net.0.weight`), keeps its structure under that key. The new key has as
    many dotted parts as the old one; tensors renamed under several keys, or out of the dict's depth
    (`^model\\.` -> ``), are not a rename of the container: the walk refuses them, naming the tensor."""
    # the containers in walk order (path, key in a dict, parent index, first slot; their ends in `spans`)
    # and each slot's container (-2: a swapped optimizer's slot, placed by its replacement)
    boxes: list[tuple[str, Any, int, int]] = []
    slot_box: list[int] = []
    stack: list[tuple[int, Node, str, Iterator[tuple[Any, Any]]]] = [(-1, tree.root, "", tree.root.items())]
    spans: dict[int, int] = {}
    while stack:
        box, node, path, it = stack[-1]
        for key, value in it:
            if isinstance(value, Node) and swap and (f"{path}.{key}" if path else str(key)) in swap:
                slot_box.extend([-2] * swap[f"{path}.{key}" if path else str(key)][1])  # not placed by the walk
                continue
            if isinstance(value, Node) and value.tensors:
                at = f"{path}.{key}" if path else str(key)
                boxes.append((at, key if node.is_dict else None, box, len(slot_box)))
                stack.append((len(boxes) - 1, value, at, value.items()))
                break
            if isinstance(value, TensorSlot):
                slot_box.append(box)
        else:
            stack.pop()
            if box >= 0:
                spans[box] = len(slot_box)
    if len(slot_box) != len(names):
        return {}  # the walk itself says the structure and the tensors disagree
    paths = [b[0] for b in boxes]
    if not any(b >= 0 and any(not t.startswith(paths[b] + ".") for t in targets.get(names[i], ()))
               for i, b in enumerate(slot_box)):
        return {}  # no tensor leaves its container: nothing renamed whole (the common case)
    out: dict[str, str] = {}
    out_of: list[str] = []
    for b, (path, key, parent, first) in enumerate(boxes):
        above = out_of[parent] if parent >= 0 else ""
        default = f"{above}.{key}" if above else str(key)
        out_of.append(default if key is not None else (f"{above}.{path.rsplit('.', 1)[-1]}" if above else path))
        if key is None:
            continue
        written = [t for i in range(first, spans[b]) if slot_box[i] != -2 for t in targets.get(names[i], ())]
        if all(t.startswith(default + ".") for t in written):
            continue
        head = f"{above}." if above else ""
        parts = str(key).count(".") + 1
        new_keys = set()
        for t in written:
            rest = t[len(head):].split(".") if t.startswith(head) else []
            if len(rest) <= parts:
                break
            new_keys.add(".".join(rest[:parts]))
        else:
            if len(new_keys) == 1:
                out_of[b] = head + new_keys.pop()
                out[path] = out_of[b]
    return out


def _add(node: Node, key: str | int | None, value: Node | TensorSlot | Plain) -> None:
    if node.is_dict:
        node.keys.append(key)
    node.values.append(value)


def _refuse_collisions(node: Node, path: str, label: str) -> None:
    """Two keys of one dict that name the same value after renames (`1` and `'1'` included)."""
    seen: set[str] = set()
    for key in node.keys:
        text = str(key)
        if text in seen:
            name = f"{path}.{text}" if path else text
            raise PlanError(f"two values of the checkpoint would be named '{name}' after the renames", file=label,
                            tensor=name)
        seen.add(text)


def _notes(tree: CheckpointTree, root: Node, left_out: list[str], renamed: Mapping[str, str]) -> list[str]:
    notes = []
    if tree.kept_count:
        notes.append(f"kept {tree.kept_count} non-tensor values of the checkpoint (a PyTorch -> PyTorch run keeps "
                     f"its structure): {_shown(tree.kept)}")
    if tree.dropped_count:
        notes.append(f"{_count(tree.dropped_count, 'value')} of the checkpoint not written (only tensors, numbers "
                     f"of at most 64 bits, strings, None and containers are): {_shown(tree.dropped)}")
    if left_out:
        notes.append(f"{_count(len(left_out), 'tensor')} left out of the checkpoint's structure (filtered or used by "
                     f"ops): {_shown(left_out)}")
    stale = _old_names(root, renamed) if renamed else []
    if stale:
        notes.append(f"kept as stored, {_count(len(stale), 'value')} of the checkpoint naming renamed tensors (e.g. "
                     "an optimizer keyed by parameter names, or param_names): update them where they are used to "
                     f"match parameters: {_shown(stale)}")
    return notes


def _old_names(root: Node, renamed: Mapping[str, str]) -> list[str]:
    """Paths of string values and of container keys equal to a renamed tensor's old key or name."""
    found: list[str] = []
    todo: list[tuple[Node, str]] = [(root, "")]
    seen: set[int] = set()  # a shared Node is looked through once
    while todo and len(found) < _SHOWN:
        node, base = todo.pop()
        for key, value in node.items():
            path = f"{base}.{key}" if base else str(key)
            if isinstance(value, Node) and id(value) not in seen:
                seen.add(id(value))
                todo.append((value, path))
            if (type(value) is str and value in renamed) or (
                    node.is_dict and type(key) is str and key in renamed and not isinstance(value, TensorSlot)):
                found.append(path)
    return found


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _shown(names: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(n[:200] for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")

"""Selection (`top_level_key`) and the walk that turns the pickled containers into named values."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...core.errors import (
    FormatError,
    LimitExceededError,
    TensorNotFoundError,
    UnsafePickleError,
    UnsupportedDTypeError,
)
from ...core.scalars import Scalar
from ..safepickle import values as sp
from .namespace import NAMESPACE
from .tree import _key_text
from .views import TensorBuilder, _Pending


class Flattener(TensorBuilder):
    """Picks the selection and walks it in order, checking every tensor (`_tensor`)."""

    _whole = True  # no top-level key (set by `_select`)
    _root: Any = None
    _selected = ""  # the key path of the selection, which names inside it are relative to
    dtensors: dict[str, sp.DTensorRef]  # name -> the DTensor whose local tensor it names (set by the reader)
    sharded: dict[str, sp.ShardedTensorRef]  # name -> a ShardedTensor, its local shards named `local_name`
    order: list[str] | None = None  # the walk's names, a ShardedTensor's once (kept only for rank files)

    def _select(self, root: Any, key: str | list[str] | tuple[str, ...] | None) -> tuple[Any, str]:
        """The part of the pickle `key` names (all of it without a key); objects the pickle builds
        from classes migrator does not know (`sp.Placeholder`) are listed in `extra()["placeholders"]`
        wherever they are, and are an error only inside the selection (`_placeholder_error`)."""
        self._whole = key is None or key == "" or key == []
        if self._opaque:  # only a pickle naming a global outside the allow-list can hold placeholders
            found = _find_placeholders(root, self._limits.max_nodes)
            self._extra["placeholders"] = [{"key": path, "class": cls} for path, cls in found]
        self._root = root
        if isinstance(root, (sp.Placeholder, sp.Opaque)):
            raise self._placeholder_error("", root)
        if self._whole or key is None:
            return root, ""
        segments = [key] if isinstance(key, str) else [str(k) for k in key]
        node, path = root, list[str]()
        todo = segments
        dotted = isinstance(key, str)
        while todo:
            if dotted:
                seg, todo = _take_key(node, todo)
            else:
                seg, todo = todo[0], todo[1:]
            child = _child(node, seg)
            if child is _MISSING:
                where = ".".join(path) or "the top level"
                raise TensorNotFoundError(
                    f"key '{seg}' not found at {where}; available keys: {_list_keys(node)}{_key_hint(node, seg)}",
                    file=self.label)
            node = child
            path.append(seg)
            if isinstance(node, sp.Placeholder):
                raise self._placeholder_error(".".join(path), node)
        self._selected = ".".join(path)
        beside = [str(k) for k, v in (root.items() if isinstance(root, dict) else ())
                  if k != path[0] and isinstance(v, dict) and "state" in v and "param_groups" in v]
        if beside:  # an optimizer state dict beside the selection is not read: said
            from ..base import left_out_note

            self.notes = [*self.notes, left_out_note(self._selected, beside)]
        if not isinstance(node, (dict, list, tuple)):
            raise self._err(f"top-level key '{'.'.join(path)}' is a {_describe(node)}, not a dict of tensors")
        return node, ""

    def _flatten(self, root: Any, prefix: str) -> _Pending:
        """Walk the selection in order, checking every tensor; the tensors are made later (`_Pending`).

        A top-level name is a new string equal to the pickle's key, not that key object. The key sits
        in memory between its record's objects (storage and tensor refs, key strings), which all die once
        the tensors are made: kept, 100k names would pin ~20 MB of allocator pools that only objects of their
        size could reuse (100k.pt pt->bpk F16 peak RSS -10 MB). The copies go with what outlives the open.
        """
        if isinstance(root, (sp.TensorRef, sp.UnsupportedTensor)):
            raise self._err("the file holds a single tensor, not a dict of tensors (a state_dict); "
                            "save {'name': tensor} instead")
        if not isinstance(root, (dict, list, tuple)):
            raise self._err(f"the checkpoint holds a {_describe(root)}, not a dict of tensors")
        seen: set[str] = set()
        # TensorRef (hashed by identity) -> its first name; a name, not an index: 100k index ints would die
        # with this dict, each leaving a hole between the offsets made meanwhile (3 MB nothing reuses)
        built: dict[sp.TensorRef, str] = {}
        groups: dict[str, str | list[str]] = {}  # storage group -> its name, or its names once shared
        pending = _Pending()
        entries = pending.entries
        tensor_ref = sp.TensorRef
        visits = 0
        max_nodes, max_nesting = self._limits.max_nodes, self._limits.max_nesting
        stack: list[tuple[str, Iterator[tuple[Any, Any]], int]] = [(prefix, _pairs(root), id(root))]
        on_path = {id(root)}
        while stack:
            base, it, cid = stack[-1]
            for key, value in it:  # the inner loop runs through a container's leaves without the stack
                visits += 1
                if visits > max_nodes:
                    raise LimitExceededError(f"more than {max_nodes} values in the checkpoint structure "
                                             "(shared references multiply; memo bomb?; max_nodes)", file=self.label)
                if type(key) is not str:
                    if type(key) is int and -_INT64 <= key < _INT64:  # str() of a 4 KiB int raises
                        key = str(key)
                    else:
                        self._ignored.append(f"{base}.<non-string key>" if base else "<non-string key>")
                        continue
                name = f"{base}.{key}" if base else "".join((key, ""))  # a copy: see the docstring
                if type(value) is sp.DTensorRef:  # a rank's shard: its local tensor, the spec kept aside
                    self.dtensors[name] = value
                    value = value.local
                elif type(value) is sp.ShardedTensorRef:  # a rank's shards: walked as a dict of its local tensors
                    self.sharded[name] = value
                    if self.order is not None:
                        self.order.append(name)
                    value = {f"\x00{i}": t for i, (t, _) in enumerate(value.shards)}  # named local_name(name, i)
                if type(value) is tensor_ref:
                    if name in seen:
                        raise self._err(f"two entries flatten to the same name '{name}'")
                    seen.add(name)
                    if self.order is not None and base not in self.sharded:  # not a ShardedTensor's local shard
                        self.order.append(name)
                    prior = built.get(value)
                    if prior is None:
                        built[value] = name
                        self._tensor(name, value, pending)
                    else:  # the same tensor object under another name: same bytes
                        entries.append((prior, name))
                    group = value.storage.key  # the tensors of one storage share bytes
                    names = groups.get(group)
                    if names is None:
                        groups[group] = name
                    elif isinstance(names, str):
                        groups[group] = [names, name]
                    else:
                        names.append(name)
                    continue
                if isinstance(value, (dict, list, tuple)):
                    if id(value) in on_path:
                        raise self._err(f"'{name}' contains itself (cyclic structure)")
                    if len(stack) >= max_nesting:
                        raise LimitExceededError(f"'{name[:200]}' is nested more than {max_nesting} levels deep "
                                                 "(max_nesting)", file=self.label)
                    on_path.add(id(value))
                    stack.append((name, _pairs(value), id(value)))
                    break
                self._leaf(name, value, seen)
            else:
                stack.pop()
                on_path.discard(cid)
        self._groups = {g: names for g, names in groups.items() if type(names) is list}
        return pending

    def _leaf(self, name: str, value: Any, seen: set[str]) -> None:
        """Everything but tensors and containers: metadata strings, scalars, refusals, ignored values."""
        if isinstance(value, (sp.UnsupportedTensor, str, bool, int, float)):
            if name in seen:
                raise self._err(f"two entries flatten to the same name '{name}'")
            seen.add(name)
        if isinstance(value, sp.UnsupportedTensor):
            what = f"{value.kind} tensors" + (f" (storage dtype {value.dtype})" if value.dtype else "")
            raise UnsupportedDTypeError(f"{what} are not supported", file=self.label, tensor=name)
        elif isinstance(value, str):
            self.metadata[name] = value
        elif isinstance(value, (bool, int, float)):
            try:
                self.scalars[name] = Scalar.of(value)
            except ValueError:
                self._ignored.append(name)  # an integer beyond 64 bits
        elif isinstance(value, sp.Placeholder):
            raise self._placeholder_error(name, value)
        elif isinstance(value, sp.Record) and value.name == NAMESPACE:
            raise self._namespace_error(name)
        else:
            self._ignored.append(name)

    def _namespace_error(self, name: str) -> UnsafePickleError:
        """A training script's `args` (read as data, for Megatron's checkpoints) where tensors are read: the
        keys that hold tensors, as for a placeholder, rather than the arguments dropped silently."""
        if self._selected and not name.startswith(self._selected):
            name = f"{self._selected}.{name}"
        message = f"{name}: a '{NAMESPACE}' object (a script's arguments), not tensors"
        keys = _tensor_keys(self._root, self._limits.max_nodes) if self._whole else []
        if keys:
            message += (f"; the keys that hold tensors are {', '.join(repr(k[:100]) for k in keys[:20])}: pick one "
                        "with --top-level-key (top_level_key in a recipe)")
        return UnsafePickleError(message, file=self.label)

    def _placeholder_error(self, name: str, value: sp.Placeholder | sp.Opaque) -> FormatError:
        """A placeholder where tensors are read: a whole model gets the state_dict advice; any other
        object names its key path, and without a top-level key, the keys that hold tensors."""
        if self._selected and not name.startswith(self._selected):
            name = f"{self._selected}.{name}"
        where = f"{name}: " if name else "the checkpoint holds "
        if value.module:
            what = f"'{value.name}'" + (" object" if isinstance(value, sp.Placeholder) else " (an nn.Module class)")
            return sp.WholeModelPickleError(
                f"{where}a {what}: this looks like a whole model saved with torch.save(model) (a whole "
                "nn.Module). migrator never runs pickled code; load it in Python and save "
                "`model.state_dict()` instead (torch.save(model.state_dict(), path))", file=self.label)
        if isinstance(value, sp.Opaque):
            return self._err(f"{where}{_describe(value)}, not a dict of tensors")
        message = (f"{where}a '{value.name}' object, which migrator refuses to build: it never runs code "
                   "from a pickle, so objects of classes outside its allow-list are kept as inert placeholders")
        if self._whole:
            keys = _tensor_keys(self._root, self._limits.max_nodes)
            message += (f"; the keys that hold tensors are {', '.join(repr(k[:100]) for k in keys[:20])}: pick "
                        "one with --top-level-key (top_level_key in a recipe)" if keys else "; no key holds tensors")
        return UnsafePickleError(message, file=self.label)


_MISSING = object()
_INT64 = 1 << 63


def _find_placeholders(root: Any, max_nodes: int) -> list[tuple[str, str]]:
    """(key path, class name) of each placeholder in the pickle, in order, the first 1000; shared
    containers are walked once (a memo bomb costs its distinct containers, not its paths)."""
    found: list[tuple[str, str]] = []
    seen: set[int] = set()
    todo: list[tuple[str, Any]] = [("", root)]
    visits = 0
    while todo and len(found) < 1000 and visits < max_nodes:
        base, node = todo.pop()
        visits += 1
        if isinstance(node, sp.Placeholder):
            found.append((base, node.name))
        elif isinstance(node, (dict, list, tuple)) and id(node) not in seen:
            seen.add(id(node))
            children = []
            for k, v in _pairs(node):
                if isinstance(v, (dict, list, tuple, sp.Placeholder)):
                    text = _key_text(k) if isinstance(node, dict) else str(k)
                    seg = text if text is not None else "<non-string key>"
                    children.append((f"{base}.{seg}" if base else seg, v))
            todo.extend(reversed(children))
    return found


def _tensor_keys(root: Any, max_nodes: int) -> list[str]:
    """The top-level keys whose values hold at least one tensor."""
    if not isinstance(root, dict):
        return []
    keys = []
    visits = 0
    for k, v in root.items():
        text = _key_text(k)
        if text is None:
            continue
        todo, seen = [v], set()
        while todo and visits < max_nodes:
            node = todo.pop()
            visits += 1
            if isinstance(node, sp.TensorRef):
                keys.append(text)
                break
            if isinstance(node, (dict, list, tuple)) and id(node) not in seen:
                seen.add(id(node))
                todo.extend(node.values() if isinstance(node, dict) else node)
    return keys



def _pairs(node: Any) -> Iterator[tuple[Any, Any]]:
    """(key, value) of a dict, (index, value) of a list or tuple."""
    return iter(node.items()) if isinstance(node, dict) else enumerate(node)


def _describe(v: Any) -> str:
    if isinstance(v, sp.TensorRef):
        return "tensor"
    if isinstance(v, sp.Opaque):
        return f"opaque object {v.name}"
    if isinstance(v, sp.Placeholder):
        return f"'{v.name}' object"
    return type(v).__name__


def _child(node: Any, seg: str) -> Any:
    if isinstance(node, dict):
        if seg in node:
            return node[seg]
        if len(seg) <= 20 and seg.lstrip("-").isdigit() and int(seg) in node:
            return node[int(seg)]
        return _MISSING
    if isinstance(node, (list, tuple)) and len(seg) <= 20 and seg.isdigit() and int(seg) < len(node):
        return node[int(seg)]
    return _MISSING


def _take_key(node: Any, segments: list[str]) -> tuple[str, list[str]]:
    """Split a dotted path: the longest run of segments that is a key here wins (keys may hold dots)."""
    parts = segments[0].split(".") if len(segments) == 1 else segments
    for i in range(len(parts), 0, -1):
        seg = ".".join(parts[:i])
        if _child(node, seg) is not _MISSING:
            return seg, ([".".join(parts[i:])] if i < len(parts) else [])
    return parts[0], []


def _key_hint(node: Any, seg: str) -> str:
    """"; did you mean 'model'?" for a mistyped key (Burn's similarity rule, over this level's keys)."""
    if not isinstance(node, dict) or len(seg) > 1000:
        return ""
    from ...naming.similarity import did_you_mean

    keys = [t for t in map(_key_text, list(node)[:10_000]) if t is not None and len(t) <= 1000]
    guess = did_you_mean(seg, keys)
    return f"; did you mean '{guess}'?" if guess else ""


def _list_keys(node: Any) -> str:
    if isinstance(node, dict):
        keys = [t for t in map(_key_text, node) if t is not None]
    elif isinstance(node, (list, tuple)):
        keys = [str(i) for i in range(len(node))]
    else:
        return f"none ({_describe(node)})"
    shown = ", ".join(repr(k[:100]) for k in keys[:50])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > 50 else "") if keys else "none"

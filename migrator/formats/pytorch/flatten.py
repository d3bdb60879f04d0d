"""Selection (`top_level_key`) and the walk that turns the pickled containers into named values."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ... import safepickle as sp
from ...errors import LimitExceededError, TensorNotFoundError, UnsupportedDTypeError
from ...scalars import Scalar
from .. import pytorch as _pkg  # the MAX_* knobs are the package's attributes (SECURITY.md), read at open
from .views import TensorBuilder, _Pending


class Flattener(TensorBuilder):
    """Picks the selection and walks it in order, checking every tensor (`_tensor`)."""

    def _select(self, root: Any, key: str | list[str] | tuple[str, ...] | None) -> tuple[Any, str]:
        if key is None or key == "" or key == []:
            return root, ""
        segments = [key] if isinstance(key, str) else [str(k) for k in key]
        node, path = root, []
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
                    f"key '{seg}' not found at {where}; available keys: {_list_keys(node)}", file=self.label)
            node = child
            path.append(seg)
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
        stack: list[tuple[str, Iterator[tuple[Any, Any]], int]] = [(prefix, _pairs(root), id(root))]
        on_path = {id(root)}
        while stack:
            base, it, cid = stack[-1]
            for key, value in it:  # the inner loop runs through a container's leaves without the stack
                visits += 1
                if visits > _pkg.MAX_NODES:
                    raise LimitExceededError(f"more than {_pkg.MAX_NODES} values in the checkpoint structure "
                                             "(shared references multiply; memo bomb?)", file=self.label)
                if type(key) is not str:
                    if type(key) is int:
                        key = str(key)
                    else:
                        self._ignored.append(f"{base}.<non-string key>" if base else "<non-string key>")
                        continue
                name = f"{base}.{key}" if base else "".join((key, ""))  # a copy: see the docstring
                if type(value) is tensor_ref:
                    if name in seen:
                        raise self._err(f"two entries flatten to the same name '{name}'")
                    seen.add(name)
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
                    elif type(names) is str:
                        groups[group] = [names, name]
                    else:
                        names.append(name)
                    continue
                if isinstance(value, (dict, list, tuple)):
                    if id(value) in on_path:
                        raise self._err(f"'{name}' contains itself (cyclic structure)")
                    if len(stack) >= _pkg.MAX_DEPTH:
                        raise LimitExceededError(f"'{name[:200]}' is nested more than {_pkg.MAX_DEPTH} levels deep",
                                                 file=self.label)
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
        else:
            self._ignored.append(name)


_MISSING = object()



def _pairs(node: Any) -> Iterator[tuple[Any, Any]]:
    """(key, value) of a dict, (index, value) of a list or tuple."""
    return iter(node.items()) if isinstance(node, dict) else enumerate(node)


def _describe(v: Any) -> str:
    if isinstance(v, sp.TensorRef):
        return "tensor"
    if isinstance(v, sp.Opaque):
        return f"opaque object {v.name}"
    return type(v).__name__


def _child(node: Any, seg: str) -> Any:
    if isinstance(node, dict):
        if seg in node:
            return node[seg]
        if seg.lstrip("-").isdigit() and int(seg) in node:
            return node[int(seg)]
        return _MISSING
    if isinstance(node, (list, tuple)) and seg.isdigit() and int(seg) < len(node):
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


def _list_keys(node: Any) -> str:
    if isinstance(node, dict):
        keys = [str(k) for k in node if isinstance(k, (str, int))]
    elif isinstance(node, (list, tuple)):
        keys = [str(i) for i in range(len(node))]
    else:
        return f"none ({_describe(node)})"
    shown = ", ".join(repr(k[:100]) for k in keys[:50])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > 50 else "") if keys else "none"

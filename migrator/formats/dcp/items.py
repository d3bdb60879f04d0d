"""The bytes of one DCP item as torch's `FileSystemWriter` stores it: a `torch.save` archive.

torch's loader (`FileSystemReader.read_data`) hands each item's byte range to `torch.load`: a
tensor's chunk with `weights_only=True` (the archive's root is the tensor itself), any other value
(a step count, a param group's `lr`, `betas`, `params`) with `weights_only=False` after the planner
`torch.save`d it into bytes. Both are the PyTorch writer's zip archive with another pickle root, so
sizes are known before anything is written and `.metadata` can be planned up front.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.errors import PlanError
from ...core.tensor import LazyTensor
from ..pytorch.namespace import NAMESPACE, DtypeValue, NamespaceValue
from ..pytorch.tree import Node
from ..pytorch_writer import PytorchWriter, _Pickle, _plain

MAX_VALUE_DEPTH = 64
"""Nesting of a plain value pickled as one item (lists of lists...): far beyond what an optimizer holds."""


class TensorItem(PytorchWriter):
    """`torch.save(tensor)`: the archive whose pickle root is one contiguous tensor."""

    def __init__(self, tensor: LazyTensor) -> None:
        super().__init__([tensor])

    def _build_pickle(self) -> bytes:
        p = _Pickle()
        p.raw(b"\x80\x02")
        self._emit_tensor(p, 0)
        p.raw(b".")
        return p.getvalue()


class ValueItem(PytorchWriter):
    """`torch.save(value)` of a plain value: None, bools, ints, floats, strings, torch dtypes and
    arguments objects (`DtypeValue`, `NamespaceValue`: Megatron's `args`), and lists, tuples and
    string-keyed dicts of them (no storage: the archive holds only its pickle)."""

    def __init__(self, value: Any, name: str) -> None:
        self._value, self._name = value, name
        super().__init__([])

    def _build_pickle(self) -> bytes:
        p = _Pickle()
        p.raw(b"\x80\x02")
        _value(p, self._value, self._name, 0)
        p.raw(b".")
        return p.getvalue()


class StructureItem(PytorchWriter):
    """`torch.save` of a structure holding tensors (`structure`'s slots) and, at its leaves, the values a
    `ValueItem` holds (Megatron's `args` beside its optimizer's step in `common.pt`)."""

    def __init__(self, tensors: Sequence[LazyTensor], structure: Node, name: str) -> None:
        self._name = name
        super().__init__(tensors, structure=structure)

    def _emit_value(self, p: _Pickle, value: Any) -> None:
        _value(p, value, self._name, 0)


def _value(p: _Pickle, v: Any, name: str, depth: int) -> None:
    if depth > MAX_VALUE_DEPTH:
        raise PlanError(f"a value nested more than {MAX_VALUE_DEPTH} deep", tensor=name)
    if isinstance(v, list):  # EMPTY_LIST, APPENDS as pickle writes it: torch's weights-only loader has no LIST
        p.raw(b"](")
        for x in v:
            _value(p, x, name, depth + 1)
        p.raw(b"e")
    elif isinstance(v, tuple):
        p.raw(b"(")
        for x in v:
            _value(p, x, name, depth + 1)
        p.raw(b"t")
    elif isinstance(v, dict):
        p.raw(b"}(")
        for k, x in v.items():
            _value(p, k, name, depth + 1)
            _value(p, x, name, depth + 1)
        p.raw(b"u")
    elif isinstance(v, NamespaceValue):  # what pickle writes for an object without __reduce__: cls(), then BUILD
        p.global_(*NAMESPACE.rsplit(".", 1))
        p.raw(b")\x81")
        _value(p, dict(v.fields), name, depth + 1)
        p.raw(b"b")
    elif isinstance(v, DtypeValue):  # torch.dtype.__reduce__ names the module's attribute: a global
        p.global_("torch", v.name)
    else:
        try:
            _plain(p, v)
        except TypeError:
            raise PlanError(f"a DCP checkpoint stores plain values only, not {type(v).__name__}", tensor=name) from None

"""One `.pt` file of a ZeRO checkpoint, read by the PyTorch reader with its pickle kept as plain values.

DeepSpeed's model and optimizer state files are `torch.save` zips whose pickles mix tensors with
bookkeeping (`param_shapes`, `partition_count`, ...) and objects of DeepSpeed's own classes (a
`LossScaler`, `fragment_address`es). The restricted interpreter (`formats.safepickle`) reads them
with nothing run: `ZeroStageEnum` is on its allow-list as an int, every other DeepSpeed object is
an inert placeholder. `StateFile` is a `PytorchReader` that keeps the pickle's root (dicts, lists,
tuples, ints, strings) so the ZeRO reader can walk it, and maps each pickled tensor to the lazy
tensor the PyTorch reader made of it (a checked byte range of the file: `data_offset`).

The typed getters (`at`, `ints`, `shapes`, ...) turn a value of the wrong kind into a one-line
`FormatError` naming the file and the key.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from ...core.bytesource import FileSource
from ...core.errors import FormatError
from ...core.limits import Limits
from ...core.tensor import LazyTensor
from ..pytorch.reader import PytorchReader
from ..pytorch.views import _Pending

_MISSING = object()


class StateFile(PytorchReader):
    """A ZeRO state file: `root` (the pickle's values) and `tensor_of(value)` for the tensors in it."""

    def __init__(self, path: str | os.PathLike[str], limits: Limits) -> None:
        self._ref_names: dict[int, str] = {}  # id of a pickled tensor record -> its flattened name
        self.root: Any = None
        self.file = os.fspath(path)
        super().__init__(FileSource(path), limits=limits)
        self._made = {t.name: t for t in self.tensors}

    # -- the PyTorch reader's steps, adjusted: the root is kept, values other than tensors are left to it

    def _select(self, root: Any, key: Any) -> tuple[Any, str]:
        self.root = root
        return super()._select(root, key)

    def _tensor(self, name: str, ref: Any, pending: _Pending) -> None:
        self._ref_names[id(ref)] = name
        super()._tensor(name, ref, pending)

    def _leaf(self, name: str, value: Any, seen: set[str]) -> None:
        """Plain values are read from `root`; DeepSpeed's placeholders (loss scaler, ...) stay inert."""

    # -- typed access

    def is_tensor(self, value: Any) -> bool:
        return self._ref_names.get(id(value)) in self._made

    def tensor_of(self, value: Any, what: str) -> LazyTensor:
        name = self._ref_names.get(id(value))
        if name is None or name not in self._made:
            raise self.bad(f"{what} is {_kind(value)}, not a tensor")
        return self._made[name]

    def data_offset(self, tensor: LazyTensor, what: str) -> int:
        """Where `tensor`'s bytes start in the file (a ZeRO partition is always one contiguous range)."""
        if tensor.span is None:
            raise self.bad(f"{what} is not a contiguous little-endian tensor", tensor.name)
        return tensor.span.offset

    def at(self, node: Any, *path: str, default: Any = _MISSING) -> Any:
        """`node[path[0]][path[1]]...`; a missing key is an error unless a `default` is given."""
        for i, key in enumerate(path):
            if not isinstance(node, Mapping):
                raise self.bad(f"'{'.'.join(path[:i]) or 'the top level'}' is {_kind(node)}, not a dict")
            if key not in node:
                if default is not _MISSING:
                    return default
                raise self.bad(f"has no '{'.'.join(path[: i + 1])}': not a DeepSpeed ZeRO state file")
            node = node[key]
        return node

    def int_of(self, value: Any, what: str) -> int:
        if type(value) is not int or value < 0:
            # a negative count is named by its value ("is a int" said nothing of what was wrong)
            shown = str(value) if type(value) is int and value.bit_length() <= 64 else _kind(value)
            raise self.bad(f"{what} is {shown}, not a non-negative integer")
        return value

    def ints(self, value: Any, what: str) -> list[int]:
        if not isinstance(value, (list, tuple)):
            raise self.bad(f"{what} is {_kind(value)}, not a list of integers")
        return [self.int_of(v, f"{what}[{i}]") for i, v in enumerate(value)]

    def shapes(self, value: Any, what: str) -> dict[str, tuple[int, ...]]:
        """A {name: torch.Size} dict (torch.Size is read as a tuple of ints)."""
        if not isinstance(value, Mapping):
            raise self.bad(f"{what} is {_kind(value)}, not a dict of shapes")
        out: dict[str, tuple[int, ...]] = {}
        for name, shape in value.items():
            if type(name) is not str:
                raise self.bad(f"{what} has a key that is {_kind(name)}, not a parameter name")
            out[name] = tuple(self.ints(shape, f"{what}['{name}']"))
        return out

    def bad(self, message: str, tensor: str | None = None) -> FormatError:
        return FormatError(message, file=self.file, tensor=tensor)


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    name = getattr(value, "name", None)  # a placeholder names its class
    if isinstance(name, str) and not isinstance(value, (str, dict, list, tuple)):
        return f"a '{name}' object"
    return f"a {type(value).__name__}"

"""The bytes of a DCP checkpoint's items: each a `torch.save` archive at an offset in a `.distcp` file.

torch's default `FileSystemWriter` appends, per item, `torch.save(chunk)` (a zip of one tensor) or
`torch.save(value)` for a non-tensor value into `__<rank>_<n>.distcp`, and records the item's offset
and length. Each is read here with the PyTorch zip reader over just that byte range
(`SubSource`), so its bounds, CRC and storage checks are the ones of any `.pt`.
"""

from __future__ import annotations

from typing import Any

from ...core.bytesource import ByteSource, FileSpan
from ...core.errors import FormatError, MigratorError
from ...core.limits import Limits
from ...core.tensor import LazyTensor
from ..pytorch.reader import PytorchReader
from ..safepickle import values as sp


class SubSource(ByteSource):
    """`length` bytes at `base` of an open source, as a source of their own (spans stay the file's)."""

    def __init__(self, parent: ByteSource, base: int, length: int) -> None:
        parent.check_range(base, length, "a checkpoint item")
        self.parent, self.base, self.size = parent, base, length
        self.label = parent.label
        self.identity = parent.identity
        self.mode = parent.mode

    def view(self, offset: int, length: int) -> memoryview:
        self.check_range(offset, length, "view")
        return self.parent.view(self.base + offset, length)

    def read(self, offset: int, length: int, what: str = "read") -> bytes:
        self.check_range(offset, length, what)
        return self.parent.read(self.base + offset, length, what)

    def span(self, offset: int, length: int) -> FileSpan | None:
        return self.parent.span(self.base + offset, length)

    def close(self) -> None:  # the parent is the checkpoint reader's to close
        pass


class _ItemReader(PytorchReader):
    """A torch.save archive holding one object (a tensor or a plain value) rather than a state_dict."""

    root: Any = None

    def _flatten(self, root: Any, prefix: str) -> Any:
        self.root = root if not isinstance(root, sp.TensorRef) else None
        if isinstance(root, sp.TensorRef):
            root = {"t": root}
        elif not isinstance(root, (dict, list, tuple)):
            root = {}
        return super()._flatten(root, prefix)


def _item(source: ByteSource, base: int, length: int, limits: Limits, name: str) -> _ItemReader:
    try:
        sub = SubSource(source, base, length)
        return _ItemReader(sub, limits=limits)
    except MigratorError as e:
        raise type(e)(f"item at bytes [{base}, {base + length}): {e.detail}", file=e.file or source.label,
                      tensor=name) from None


def chunk_tensor(source: ByteSource, base: int, length: int, limits: Limits, name: str) -> LazyTensor:
    """The tensor torch.save wrote at [base, base + length) of `source`."""
    reader = _item(source, base, length, limits, name)
    found = [t for t in reader.tensors if t.name == "t"]
    if not found or reader.root is not None:
        raise FormatError(f"item at bytes [{base}, {base + length}) holds no tensor", file=source.label, tensor=name)
    return found[0]


def item_value(source: ByteSource, base: int, length: int, limits: Limits, name: str) -> Any:
    """The plain value torch.save wrote at [base, base + length) (a step count, a param_groups entry),
    as the restricted interpreter built it."""
    reader = _item(source, base, length, limits, name)
    return reader.root

"""Lazy tensors from storage records: byte ranges checked against storages, strided and big-endian views."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...core.bytesource import ByteSource
from ...core.dtypes import BY_TORCH
from ...core.errors import LimitExceededError, UnsupportedDTypeError
from ...core.tensor import LazyTensor, stored, stored_many
from ..safepickle import values as sp
from .core import ReaderCore, _Span

_SUPPORTED = dict(BY_TORCH)



class TensorBuilder(ReaderCore):
    """Checks each selected tensor against its storage and queues its lazy tensor (`_Pending`).

    It needs only the storages' spans, which each container locates (`ZipContainer._zip_span`, the
    `_spans` of legacy and tar files): the reader composes them, so this builds on the shared core."""

    def _storage_span(self, ref: sp.StorageRef, tensor: str) -> _Span:
        """The bytes a storage covers, resolving legacy storage views; checked against the declared size."""
        if self._zip:
            span = self._zip_span(ref.key, tensor)
        else:
            found = self._spans.get(ref.key)  # legacy and tar storages
            if found is None:
                raise self._err(f"storage '{ref.key}' has no data in the file", tensor)
            span = found
        esize = sp.ELEMENT_SIZES.get(ref.dtype or "")
        if ref.numel is not None and esize is not None:
            declared = ref.numel * esize
            if ref.view is None and declared > span.nbytes:
                raise self._err(f"storage '{ref.key}' declares {declared} bytes but the file holds "
                                f"{span.nbytes} (truncated?)", tensor)
            if ref.view is None and declared != span.nbytes:
                span = _Span(span.offset, declared)
        if ref.view is not None:
            vkey, voff, vsize = ref.view
            if esize is None:
                raise UnsupportedDTypeError(f"storage view of unknown type {ref.storage_type}",
                                            file=self.label, tensor=tensor)
            start, nbytes = voff * esize, vsize * esize
            if start + nbytes > span.nbytes:
                raise self._err(f"storage view '{vkey}' exceeds its storage '{ref.key}'", tensor)
            span = _Span(span.offset + start, nbytes)  # views of one root share its key
        return span

    def _tensor(self, name: str, ref: sp.TensorRef, pending: _Pending) -> None:
        """Check `ref` and add its lazy tensor to `pending`."""
        dname = ref.dtype if ref.dtype is not None else ref.storage.dtype
        shape, stride = ref.size, ref.stride
        layout = self._layouts.get((dname, shape, stride))
        if layout is None:
            layout = self._layout(name, ref, dname)
        dt, nbytes, extent, contiguous, shape = layout  # one shape tuple for all tensors of that layout
        span_offset, span_nbytes = self._storage_span(ref.storage, name)
        if nbytes == 0:
            pending.entries.append(LazyTensor(name, dt, shape, 0, loader=_empty, origin=self.label))
            return
        itemsize = dt.itemsize
        max_index = ref.offset + extent
        if (max_index + 1) * itemsize > span_nbytes:
            raise self._err(
                f"shape {list(shape)}, stride {list(ref.stride)} and offset {ref.offset} reach element "
                f"{max_index} but storage '{ref.storage.key}' holds {span_nbytes // itemsize} {dname} elements",
                name)
        start = span_offset + ref.offset * itemsize
        if contiguous and not self._swap:
            pending.add_stored(name, dt, shape, start, nbytes)
        else:
            pending.entries.append(self._view_tensor(name, ref, dt, nbytes, start, max_index))

    def _layout(self, name: str, ref: sp.TensorRef, dname: str | None) -> tuple[Any, int, int, bool,
                                                                                 tuple[int, ...]]:
        """dtype, byte length, furthest element, contiguity and shape of a (dtype, size, stride): cached,
        since a model repeats a few shapes many times (and the tensors share the first one's shape tuple)."""
        dt = _SUPPORTED.get(dname or "")
        if dt is None:
            what = f"torch dtype {dname}" if dname else f"storage type {ref.storage.storage_type}"
            raise UnsupportedDTypeError(f"{what} is not supported", file=self.label, tensor=name)
        assert dt.itemsize is not None
        shape, stride = ref.size, ref.stride
        nbytes = dt.nbytes(shape)
        assert nbytes is not None
        extent = sum((s - 1) * st for s, st in zip(shape, stride, strict=True)) if nbytes else 0
        layout = (dt, nbytes, extent, _is_contiguous(shape, stride), shape)
        self._layouts[(dname, shape, stride)] = layout
        return layout

    def _view_tensor(self, name: str, ref: sp.TensorRef, dt: Any, nbytes: int, start: int,
                     max_index: int) -> LazyTensor:
        """A tensor that is not a verbatim byte range: big-endian, or a strided view."""
        shape = ref.size
        itemsize = dt.itemsize
        label = self.label
        window = (max_index - ref.offset + 1) * itemsize
        src, swap = self.source, self._swap and itemsize > 1
        unit = itemsize // 2 if dt.kind.value == "complex" else itemsize
        if _is_contiguous(shape, ref.stride):
            if not swap:
                return stored(name, dt, shape, src, start, nbytes)
            return LazyTensor(name, dt, shape, nbytes, origin=label,
                              loader=lambda: _swapped(src.view(start, nbytes), unit))
        if nbytes > max(window, self._limits.max_expanded_bytes):
            raise LimitExceededError(
                f"strided view of {window} storage bytes expands to {nbytes} bytes "
                f"(limit {self._limits.max_expanded_bytes}, max_expanded_bytes)", file=label, tensor=name)
        strides = tuple(st * itemsize for st in ref.stride)
        return LazyTensor(name, dt, shape, nbytes, origin=label,
                          loader=StridedView(src, start, window, itemsize, shape, strides, swap, unit))


class _Pending:
    """The selection's tensors in order, as checked by `_flatten` but not made yet.

    A verbatim byte range (nearly every tensor) is a row of five columns, made by `stored_many` in one
    pass once the pickle's objects are gone; `entries` holds, per tensor, None (the next row), a tensor
    made already (views, empty, big-endian) or (first, name): the tensor named `first` again under `name`.
    """

    __slots__ = ("dtypes", "entries", "lengths", "names", "offsets", "shapes")

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.names: list[str] = []
        self.dtypes: list[Any] = []
        self.shapes: list[tuple[int, ...]] = []
        self.offsets: list[int] = []
        self.lengths: list[int] = []

    def add_stored(self, name: str, dtype: Any, shape: tuple[int, ...], offset: int, nbytes: int) -> None:
        self.entries.append(None)
        self.names.append(name)
        self.dtypes.append(dtype)
        self.shapes.append(shape)
        self.offsets.append(offset)
        self.lengths.append(nbytes)

    def build(self, source: ByteSource) -> list[LazyTensor]:
        made = stored_many(source, self.names, self.dtypes, self.shapes, self.offsets, self.lengths)
        self.names, self.dtypes, self.shapes, self.offsets, self.lengths = [], [], [], [], []
        if len(made) == len(self.entries):  # every entry a row (None): the rows are the tensors
            return made
        rows = iter(made)
        out: list[LazyTensor] = []
        by_name: dict[str, LazyTensor] = {}  # names are unique (`_flatten` checks)
        for e in self.entries:
            if e is None:
                t = next(rows)
            elif type(e) is tuple:
                t = by_name[e[0]].renamed(e[1])
            else:
                t = e
            out.append(t)
            by_name[t.name] = t
        return out



def _empty() -> bytes:
    return b""



_UINTS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class StridedView:
    """The loader of a strided view: its elements copied into C order from the storage window
    [start, start + window) of `src`. An object rather than a closure so a reader that holds
    only a window at a time (migrator/analysis/tiles.py) can copy the same elements band by band."""

    __slots__ = ("itemsize", "shape", "src", "start", "strides", "swap", "unit", "window")

    def __init__(self, src: ByteSource, start: int, window: int, itemsize: int, shape: tuple[int, ...],
                 strides: tuple[int, ...], swap: bool, unit: int) -> None:
        self.src, self.start, self.window, self.itemsize = src, start, window, itemsize
        self.shape, self.strides, self.swap, self.unit = shape, strides, swap, unit

    def __call__(self) -> memoryview:
        return _gather(self.src, self.start, self.window, self.itemsize, self.shape, self.strides, self.swap,
                       self.unit)


def _gather(src: ByteSource, start: int, window: int, itemsize: int, shape: tuple[int, ...],
            strides: tuple[int, ...], swap: bool, unit: int) -> memoryview:
    """Copy a strided view's elements into C order; reads only the view's own storage window."""
    buf = src.view(start, window)
    if itemsize in _UINTS:
        base = np.frombuffer(buf, dtype=_UINTS[itemsize])
    else:
        base = np.frombuffer(buf, dtype=np.dtype((np.void, itemsize)))
    arr = np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides, writeable=False)
    out = np.ascontiguousarray(arr)
    if swap:
        out = _swap_array(out.reshape(-1).view(np.uint8), unit)
    return memoryview(out.reshape(-1).view(np.uint8).data)


def swap_array(raw: np.ndarray, unit: int) -> np.ndarray:
    """Bytes of `unit`-byte big-endian elements byte-swapped (a new array)."""
    return _swap_array(raw, unit)


def _swap_array(raw: np.ndarray, unit: int) -> np.ndarray:
    return raw.view(_UINTS[unit]).byteswap().view(np.uint8)


def _swapped(view: memoryview, unit: int) -> memoryview:
    """Big-endian storage bytes as the little-endian bytes migrator hands out."""
    return memoryview(_swap_array(np.frombuffer(view, dtype=np.uint8), unit).data)


def _is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True

"""Lazy tensors: dtype, shape and byte length known up front, bytes produced on demand.

A reader hands these out without touching tensor data; a writer plans its whole layout from the
declared lengths, then asks each tensor for its bytes once, in write order, and drops them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import repeat
from typing import TYPE_CHECKING, Any

from .bytesource import ByteSource, FileSource, FileSpan, FileView, file_view
from .dtypes import DType
from .errors import MigratorError, ReaderClosedError, TensorBytesSizeMismatchError, UnsupportedDTypeError

if TYPE_CHECKING:  # imported on first use: a pass-through copy never needs numpy
    import numpy as np

Buffer = bytes | bytearray | memoryview
Loader = Callable[[], Buffer]
Chunker = Callable[[], Iterator[Buffer]]


@dataclass(frozen=True, eq=False, slots=True, init=False)
class LazyTensor:
    """One tensor's description plus a way to get its raw little-endian, C-order bytes.

    Slotted: a 100k-tensor model holds several of these per tensor (reader, renames, plan).
    `chunks`, when set, yields the same bytes piece by piece, so a writer can stream a computed
    tensor (cast, transpose) without holding all of it.

    `__init__` is hand-written (same signature as the generated one): it fills the slots through
    their descriptors, about twice as fast as the frozen dataclass's object.__setattr__ per field,
    and a plan makes one to three of these per tensor (rename, transpose, cast).
    """

    name: str
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int
    loader: Loader = field(repr=False)
    span: FileSpan | None = field(default=None, repr=False)
    param_id: int | None = None
    origin: str | None = None  # the file it came from, for error messages
    chunks: Chunker | None = field(default=None, repr=False)

    def __init__(self, name: str, dtype: DType, shape: tuple[int, ...], nbytes: int, loader: Loader,
                 span: FileSpan | None = None, param_id: int | None = None, origin: str | None = None,
                 chunks: Chunker | None = None) -> None:
        _set_name(self, name)
        _set_dtype(self, dtype)
        _set_shape(self, shape)
        _set_nbytes(self, nbytes)
        _set_loader(self, loader)
        _set_span(self, span)
        _set_param_id(self, param_id)
        _set_origin(self, origin)
        _set_chunks(self, chunks)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def data(self) -> memoryview:
        """The tensor's bytes, checked against the declared length."""
        try:
            buf = memoryview(self.loader()).cast("B")
        except ReaderClosedError as e:  # name the tensor too
            raise ReaderClosedError(e.detail, file=e.file, tensor=self.name) from None
        if len(buf) != self.nbytes:
            raise TensorBytesSizeMismatchError(
                f"produced {len(buf)} bytes but declares {self.nbytes}", file=self.origin, tensor=self.name
            )
        return buf

    def numpy(self) -> np.ndarray:
        """A numpy array over the bytes (zero-copy and read-only where the source allows)."""
        import numpy as np

        if self.dtype.numpy_name is None:
            raise UnsupportedDTypeError(
                f"{self.dtype.display} cannot be viewed as numpy", file=self.origin, tensor=self.name
            )
        flat = np.frombuffer(self.data(), dtype=self.dtype.numpy())
        try:
            return flat.reshape(self.shape)
        except ValueError as e:  # numpy's own size limit: an empty tensor with a dimension near 2**63
            raise MigratorError(f"shape {list(self.shape)} cannot be a numpy array ({e})", file=self.origin,
                                tensor=self.name) from None

    def renamed(self, name: str) -> LazyTensor:
        # direct construction: dataclasses.replace inspects the fields on every call, and a plan renames
        # every tensor
        return LazyTensor(name, self.dtype, self.shape, self.nbytes, self.loader, self.span, self.param_id,
                          self.origin, self.chunks)

    def derived(self, *, dtype: DType, shape: tuple[int, ...], loader: Loader,
                chunks: Chunker | None = None) -> LazyTensor:
        """A tensor computed from this one (transpose, cast): no longer a verbatim file span."""
        nbytes = dtype.nbytes(shape)
        if nbytes is None:
            raise UnsupportedDTypeError(f"cannot compute {dtype.display} tensors", tensor=self.name)
        return LazyTensor(self.name, dtype, shape, nbytes, loader, None, self.param_id, self.origin, chunks)


# the slots' own setters (frozen: plain assignment raises), bound once for LazyTensor.__init__
(_set_name, _set_dtype, _set_shape, _set_nbytes, _set_loader, _set_span, _set_param_id, _set_origin,
 _set_chunks) = (getattr(LazyTensor, f.name).__set__ for f in fields(LazyTensor))


class _View:
    """The loader of a stored tensor: a slotted callable, smaller and faster to make than a closure."""

    __slots__ = ("length", "offset", "source")

    def __init__(self, source: ByteSource, offset: int, length: int) -> None:
        self.source, self.offset, self.length = source, offset, length

    def __call__(self) -> memoryview:
        return self.source.view(self.offset, self.length)


def stored(name: str, dtype: DType, shape: tuple[int, ...], source: ByteSource, offset: int, nbytes: int,
           *, param_id: int | None = None) -> LazyTensor:
    """A tensor whose bytes lie verbatim at `offset` in `source`."""
    if type(source).span is FileSource.span:  # its span is its loader: one object, not two
        view = file_view(source, source.fd, offset, nbytes)  # type: ignore[attr-defined]
        return LazyTensor(name, dtype, shape, nbytes, view, view, param_id, source.label)
    chunker = getattr(source, "chunker", None)  # a remote object: its bytes stream in blocks
    return LazyTensor(
        name=name,
        dtype=dtype,
        shape=shape,
        nbytes=nbytes,
        loader=_View(source, offset, nbytes),
        span=source.span(offset, nbytes),
        param_id=param_id,
        origin=source.label,
        chunks=None if chunker is None else chunker(offset, nbytes),
    )


def from_numpy(name: str, array: Any, *, dtype: DType | None = None,
               param_id: int | None = None) -> LazyTensor:
    """Wrap an in-memory array (made C-contiguous little-endian; bytes copied only if needed).

    `array`: a numpy array, a torch tensor (bf16 included; torch is not imported for it) or
    anything with `__array__`, `__dlpack__` or `.numpy()` (see `migrator.core.arrays`).
    """
    import numpy as np

    from . import dtypes
    from .arrays import as_array

    array = as_array(array, name)
    try:
        dt = dtype or dtypes.from_numpy(array.dtype)
    except MigratorError as e:
        raise type(e)(e.detail, tensor=name) from None
    arr = np.ascontiguousarray(array).reshape(np.shape(array))  # ascontiguousarray makes 0-d arrays 1-d
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    shape = tuple(map(int, arr.shape))
    nbytes = arr.nbytes
    return LazyTensor(name, dt, shape, nbytes, loader=lambda: arr.reshape(-1).view(np.uint8).data,
                      param_id=param_id)


def as_tensors(tensors: Mapping[str, Any] | Iterable[LazyTensor]) -> list[LazyTensor]:
    """`save`'s input as lazy tensors: LazyTensors as they are, or a mapping of name -> LazyTensor,
    numpy array, torch tensor (a reader is such a mapping)."""
    if isinstance(tensors, Mapping):
        out: list[LazyTensor] = []
        for name, value in tensors.items():
            if not isinstance(name, str):
                raise MigratorError(f"tensor names must be strings, got {name!r}")
            if isinstance(value, LazyTensor):
                out.append(value if value.name == name else value.renamed(name))
            else:
                out.append(from_numpy(name, value))
        return out
    out = list(tensors)
    for t in out:
        if not isinstance(t, LazyTensor):
            raise MigratorError(f"expected LazyTensors (or a dict of name -> array), got a {type(t).__name__}; "
                                "use migrator.from_numpy(name, array) or pass {name: array}")
    return out


# A frozen dataclass's constructor sets each field with a Python-level object.__setattr__, which
# dominates reading a header of 100k tensors. `stored_many` makes the very same objects and
# fills each slot for all tensors in one C-level pass, when the classes still have exactly the fields
# it knows (no __post_init__); otherwise it uses the constructors.
_LAZY_FIELDS = ("name", "dtype", "shape", "nbytes", "loader", "span", "param_id", "origin", "chunks")
_SLOTTED = (tuple(f.name for f in fields(LazyTensor)) == _LAZY_FIELDS
            and tuple(f.name for f in fields(FileSpan)) == ("fd", "offset", "length")
            and FileView.__slots__ == ("source",)
            and sorted(_View.__slots__) == ["length", "offset", "source"]
            and not any(hasattr(c, "__post_init__") for c in (LazyTensor, FileSpan)))


def _fill(cls: type, n: int, **columns: Iterable[Any]) -> list[Any]:
    """n instances of a slotted class, every slot set from its column (one C-level pass per slot)."""
    objs: list[Any] = list(map(object.__new__, repeat(cls, n)))
    for slot, values in columns.items():
        deque(map(getattr(cls, slot).__set__, objs, values), maxlen=0)
    return objs


def stored_many(source: ByteSource, names: Sequence[str], dtypes_: Sequence[DType],
                shapes: Sequence[tuple[int, ...]], offsets: Sequence[int], lengths: Sequence[int],
                param_ids: Sequence[int | None] | None = None) -> list[LazyTensor]:
    """`[tensor.stored(...) for ...]` for many tensors at once: equal objects, built slot by slot."""
    n = len(names)
    pids: Iterable[int | None] = param_ids if param_ids is not None else repeat(None)
    label = repeat(source.label)
    span = type(source).span
    if span is FileSource.span:  # each tensor's span is its loader (`stored`), made without a call per tensor
        fd = source.fd  # type: ignore[attr-defined]
        if not _SLOTTED:
            views = list(map(file_view, repeat(source), repeat(fd), offsets, lengths))
            return list(map(LazyTensor, names, dtypes_, shapes, lengths, views, views, pids, label))
        views = _fill(FileView, n, offset=offsets, length=lengths, source=repeat(source))
        deque(map(vars(FileSpan)["fd"].__set__, views, repeat(fd)), maxlen=0)  # the slot, not FileView.fd
        return _fill(LazyTensor, n, name=names, dtype=dtypes_, shape=shapes, nbytes=lengths, loader=views,
                     span=views, param_id=pids, origin=label, chunks=repeat(None))
    spans: Iterable[FileSpan | None] = repeat(None) if span is ByteSource.span else map(source.span, offsets, lengths)
    chunker = getattr(source, "chunker", None)  # a remote object: its bytes stream in blocks
    chunks: Iterable[Chunker | None] = repeat(None) if chunker is None else map(chunker, offsets, lengths)
    if not _SLOTTED:
        return list(map(LazyTensor, names, dtypes_, shapes, lengths, map(_View, repeat(source), offsets, lengths),
                        spans, pids, label, chunks))
    views = _fill(_View, n, source=repeat(source), offset=offsets, length=lengths)
    return _fill(LazyTensor, n, name=names, dtype=dtypes_, shape=shapes, nbytes=lengths, loader=views, span=spans,
                 param_id=pids, origin=label, chunks=chunks)

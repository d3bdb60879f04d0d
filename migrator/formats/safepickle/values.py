"""What the interpreter builds: inert stand-ins for globals and objects, tensor descriptions, the limits.

Nothing here is ever called by a pickle: these are plain data classes that the allow-list's
handlers (`allowlist.py`) and the opcode handlers (`opcodes.py`) construct.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...core.errors import UnsafePickleError

if TYPE_CHECKING:
    from .machine import Machine


class WholeModelPickleError(UnsafePickleError):
    """The pickle is a whole `torch.save(model)`: it needs the model's classes, so we refuse it."""



# --------------------------------------------------------------------------------------------
# Placeholder objects (what allow-listed globals and their calls turn into)


@dataclass(eq=False)
class Opaque:
    """A global migrator does not know (or a value built only as data from one); never called."""

    name: str
    state: Any = field(default=None, repr=False)
    module: bool = False  # a class a legacy persistent id names as an nn.Module's

    def __repr__(self) -> str:
        return f"Opaque({self.name!r})"


@dataclass(eq=False, slots=True)
class Placeholder:
    """An object of a class migrator does not build: only the class name is kept (never called).

    `module` is True when it looks like an `nn.Module` (a `torch.nn` class, a class a legacy
    persistent id names as a module, or BUILD state holding `_parameters`/`_modules`): that is a
    whole pickled model, and the reader gives the advice to save a state_dict.
    """

    name: str
    module: bool = False

    def __repr__(self) -> str:
        return f"Placeholder({self.name!r})"


@dataclass(frozen=True)
class TorchDtype:
    """`torch.float32` and friends (pickled as GLOBAL 'torch' 'float32')."""

    name: str


@dataclass(frozen=True)
class StorageType:
    """A storage class such as `torch.FloatStorage`; `dtype` is None for unknown classes."""

    name: str
    dtype: str | None


@dataclass(frozen=True)
class TorchType:
    """A harmless torch class referenced as data (`torch.Tensor`, `torch.nn.Parameter`)."""

    name: str


@dataclass(frozen=True)
class Device:
    """`torch.device(...)`, kept as its string form."""

    spec: str


@dataclass(eq=False)
class NumpyDtype:
    """`numpy.dtype(code)`; BUILD fills in the byte order. `known` is False for other codes."""

    code: str
    byteorder: str = "="
    known: bool = True


@dataclass(eq=False)
class NumpyArray:
    """A pickled numpy array, recorded (shape, dtype) but not exposed as a tensor."""

    shape: tuple[int, ...] = ()
    dtype: NumpyDtype | None = None


@dataclass(eq=False, slots=True)
class StorageRef:
    """One storage a tensor reads from, as named by a persistent id (slotted: one per tensor).

    `numel` counts elements of `dtype` (None when the id does not say); `view` is the legacy
    storage-view triple (view key, element offset, element count) or None.
    """

    key: str
    storage_type: str
    dtype: str | None
    numel: int | None
    location: str
    view: tuple[str, int, int] | None = None


@dataclass(eq=False, slots=True)
class TensorRef:
    """A tensor as the pickle describes it: a strided window on a storage (slotted: one per tensor)."""

    storage: StorageRef
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str | None = None  # from _rebuild_tensor_v3; else the storage's dtype
    requires_grad: bool = False

    @property
    def dtype_name(self) -> str | None:
        return self.dtype if self.dtype is not None else self.storage.dtype


@dataclass(eq=False)
class UnsupportedTensor:
    """A tensor migrator recognises but cannot read (quantized, sparse, nested, meta, ...)."""

    kind: str
    dtype: str | None = None


@dataclass(eq=False, slots=True)
class Record:
    """An object of an allow-listed plain-data class (DCP metadata, DTensor specs): its class name, the
    arguments it was made with and the state BUILD gave it, kept as data. No method of the class runs:
    the format that asked for the class reads the fields it knows (`formats.dcp.metadata`)."""

    name: str
    args: tuple[Any, ...] = ()
    state: Any = None


@dataclass(eq=False, slots=True)
class DTensorRef:
    """A pickled DTensor: this rank's local tensor, the global size and dtype, and its spec (a
    `Record` of `DTensorSpec`: mesh, placements), read as data by `formats.pytorch.dtensor`."""

    local: TensorRef
    size: tuple[int, ...]
    dtype: str | None
    spec: Any


@dataclass(eq=False, slots=True)
class ShardedTensorRef:
    """A pickled `ShardedTensor` (FSDP1's SHARDED_STATE_DICT and LOCAL_STATE_DICT values): this rank's local
    shards, each (tensor, `Record` of its `ShardMetadata`), the global size and dtype, the `Record` of the
    `ShardedTensorMetadata` (every rank's shard) and of the `ProcessGroupState` it was saved from; read as
    data by `formats.pytorch.sharded_tensor`."""

    shards: list[tuple[TensorRef, Any]]
    size: tuple[int, ...]
    dtype: str | None
    metadata: Any
    group: Any


class ODict(dict):
    """An `OrderedDict` (a state_dict); `attrs` keeps BUILD state such as `_metadata`.

    Slotted, with `attrs` made on first use: torch.save pickles an empty OrderedDict (the backward
    hooks) for every tensor, so a 100k-tensor file builds 100k of these.
    """

    __slots__ = ("_attrs",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._attrs: dict[str, Any] | None = None

    @property
    def attrs(self) -> dict[str, Any]:
        a = self._attrs
        if a is None:
            a = self._attrs = {}
        return a


Handler = Callable[["Machine", tuple, dict], Any]


@dataclass(frozen=True, eq=False)
class Builtin:
    """An allow-listed global; `call` builds data from the arguments (None: not callable)."""

    name: str
    call: Handler | None = field(default=None, repr=False)


# --------------------------------------------------------------------------------------------
# dtypes and storage classes

ELEMENT_SIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
}
"""Bytes per element of every torch dtype a checkpoint may name (needed to walk legacy data)."""

_DTYPE_ALIASES = {
    "float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32",
    "short": "int16", "cfloat": "complex64", "cdouble": "complex128", "chalf": "complex32",
}

_STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
    "ComplexDoubleStorage": "complex128", "ComplexFloatStorage": "complex64",
    "QInt8Storage": "qint8", "QUInt8Storage": "quint8", "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8",  # raw bytes; _rebuild_tensor_v3 names the real dtype
    "TypedStorage": None,
}


def storage_type_dtype(name: str) -> str | None:
    """The dtype of a storage class name (`FloatStorage` -> float32), None if unknown."""
    return _STORAGE_DTYPES.get(name)


def _tname(v: Any) -> str:
    if isinstance(v, Opaque):
        return f"opaque object {v.name}"
    if isinstance(v, Placeholder):
        return f"'{v.name}' object"
    return type(v).__name__

def describe(v: Any) -> str:
    """A short description of a pickled value for error messages: never formats a big integer or
    a nested value (str() of either can raise or take unbounded time)."""
    if type(v) is str:
        return repr(v[:40]) + ("..." if len(v) > 40 else "")
    if type(v) is int:
        return str(v) if -(1 << 63) <= v < 1 << 63 else f"a {v.bit_length()}-bit integer"
    if isinstance(v, (Opaque, Placeholder, StorageType, TorchType, TorchDtype)):
        return v.name if not isinstance(v, Placeholder) else f"a '{v.name}' object"
    return f"a {type(v).__name__}"


# What `charge` counts per object: its size and two references to it (stack, memo). Only objects that can
# cost more than the budget per input byte are charged: a set or frozenset (216 bytes on CPython 3.11)
# from 1-2 bytes; the rest stay below it (an empty dict, 64 bytes, is the largest from one byte).
_SET_SIZE = sys.getsizeof(set()) + 16
_PLACEHOLDER_SIZE = sys.getsizeof(Placeholder("x")) + 16
_MEMO_ENTRY = 112  # a new memo entry at the peak of the memo dict's resize: its int key, old and new slots

"""A restricted pickle interpreter: reads the data torch checkpoints hold and never runs code.

Python's `pickle` imports every global a file names and calls whatever the file asks it to; even
torch's `weights_only` mode imports torch. This module interprets the opcodes itself (protocols
0-5) and resolves globals against an allow-list into inert placeholder objects, so the worst a
hostile file can do is make the load fail with a typed error:

* allow-listed globals (tensor rebuild functions, storage classes, dtypes, `OrderedDict`, a few
  builtins and numpy scalar types) are replaced by handlers written here that only build data;
* any other global becomes an `Opaque` placeholder; calling or instantiating it builds an inert
  `Placeholder` that records only the class name (nothing is imported, called or built, and its
  arguments and state are dropped), so a training checkpoint's `args`, `hyper_parameters` or
  callbacks do not stop the weights beside them from loading: the reader refuses a placeholder only
  inside the selected part of the checkpoint. Globals of code-running modules (`os`, `subprocess`,
  `builtins`, `functools`, ...) are refused the moment something calls them;
* every size is bounded before anything is allocated (see `Limits`).

Tensors are returned as `TensorRef` descriptions; the container format (zip, legacy, tar) turns
the persistent ids into `StorageRef`s through the `persistent_load` callback.
"""

from __future__ import annotations

import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import FormatError, LimitExceededError, UnsafePickleError

__all__ = [
    "ELEMENT_SIZES",
    "Builtin",
    "Device",
    "Limits",
    "NumpyArray",
    "NumpyDtype",
    "ODict",
    "Opaque",
    "Placeholder",
    "StorageRef",
    "StorageType",
    "TensorRef",
    "TorchDtype",
    "TorchType",
    "Unpickler",
    "UnsupportedTensor",
    "WholeModelPickleError",
    "describe",
    "load",
    "storage_type_dtype",
]


class WholeModelPickleError(UnsafePickleError):
    """The pickle is a whole `torch.save(model)`: it needs the model's classes, so we refuse it."""


@dataclass(frozen=True)
class Limits:
    """Upper bounds on what one pickle may make the interpreter hold.

    A memo fetch is a shared reference here (never a copy), so interpreter memory grows at most
    linearly with the input; the exponential "memo bomb" can only appear when a consumer walks
    the result, which is why `pytorch.py` counts the nodes it visits (1M, like Burn).
    """

    max_memo: int = 5_000_000  # memo entries
    max_stack: int = 5_000_000  # values on the stack (one MARK frame)
    max_marks: int = 1_000  # MARK frames open at once
    max_objects: int = 10_000_000  # values pushed in total
    max_long_bytes: int = 4096  # LONG1/LONG4 payloads and text integer digits
    max_key_depth: int = 32  # tuple nesting inside dict keys and set members; nested rebuild calls
    max_dims: int = 64  # tensor rank
    max_same_hash: int = 64  # non-string keys of one dict (members of one set) with one hash value
    max_object_bytes: int = 80  # bytes of containers built per pickle byte (plus 1 MiB), see `charge`


DEFAULT_LIMITS = Limits()

FAST_PATH = True
"""Interpret torch's tensor records (`_rebuild_tensor_v2(...)`) in one step when they have the exact
shape torch.save writes; anything else (and any record that would hit a limit or an error) goes
through the general opcode loop, which stays the reference. False: always the general loop."""


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


class ODict(dict):  # type: ignore[type-arg]
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


Handler = Callable[["Unpickler", tuple, dict], Any]  # type: ignore[type-arg]


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


# --------------------------------------------------------------------------------------------
# The interpreter

_MARK = object()  # pushed by no opcode; the metastack holds MARK frames instead
# What `charge` counts per object: its size and two references to it (stack, memo). Only objects that can
# cost more than the budget per input byte are charged: a set or frozenset (216 bytes on CPython 3.11)
# from 1-2 bytes; the rest stay below it (an empty dict, 64 bytes, is the largest from one byte).
_SET_SIZE = sys.getsizeof(set()) + 16
_PLACEHOLDER_SIZE = sys.getsizeof(Placeholder("x")) + 16
_MEMO_ENTRY = 112  # a new memo entry at the peak of the memo dict's resize: its int key, old and new slots
_BUDGET_BASE = 1 << 20  # bytes of objects any pickle may build, whatever its size


class Unpickler:
    """Interprets one pickle from `data[start:end]`; `pos` is left just past its STOP."""

    def __init__(
        self,
        data: bytes | bytearray | memoryview,
        *,
        label: str | None = None,
        start: int = 0,
        end: int | None = None,
        persistent_load: Callable[[Any], Any] | None = None,
        limits: Limits = DEFAULT_LIMITS,
        what: str = "pickle",
        fast: bool | None = None,
    ) -> None:
        self.data = data if isinstance(data, bytes) else memoryview(data).cast("B")
        self.fast = FAST_PATH if fast is None else fast
        self.label = label
        self.pos = start
        self.end = len(self.data) if end is None else min(end, len(self.data))
        self.persistent_load = persistent_load
        self.limits = limits
        self.what = what
        self.protocol: int | None = None
        self.opaque: set[str] = set()
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self._dims: dict[bytes, tuple[tuple[int, ...], int]] = {}  # see _quick_dims
        self._tails: dict[bytes, _Tail] = {}  # see _quick_key
        self.objects = 0
        self.placeholders = 0  # Placeholder objects made (the reader walks for their key paths if any)
        self.spent = 0  # bytes of the containers made so far (see `charge`)
        self.budget = limits.max_object_bytes * max(self.end - start, 0) + _BUDGET_BASE
        self._hashes: dict[int, tuple[Any, dict[int, int]]] = {}  # id(container) -> (it, hash counts)
        self._depth = 0  # nested calls of allow-listed handlers (`call`)
        self._op_pos = start
        self._result: Any = None
        self._done = False

    # -- errors ------------------------------------------------------------------------------

    def error(self, message: str) -> FormatError:
        return FormatError(f"{self.what}: {message} (at byte {self._op_pos})", file=self.label)

    def limit(self, message: str) -> LimitExceededError:
        return LimitExceededError(f"{self.what}: {message} (at byte {self._op_pos})", file=self.label)

    def unsafe(self, message: str) -> UnsafePickleError:
        return UnsafePickleError(f"{self.what}: {message}", file=self.label)

    # -- input -------------------------------------------------------------------------------

    def read(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.end - self.pos:
            raise self.error(f"{what} declares {n} bytes but only {self.end - self.pos} remain (truncated?)")
        p = self.pos
        self.pos = p + n
        return bytes(self.data[p : p + n])

    def readline(self, what: str) -> bytes:
        """Bytes up to the next newline (excluded); the newline must exist before the end."""
        p, end = self.pos, self.end
        if isinstance(self.data, bytes):
            i = self.data.find(b"\n", p, end)
        else:
            i, q = -1, p
            while q < end:
                chunk = bytes(self.data[q : min(q + 65536, end)])
                j = chunk.find(b"\n")
                if j >= 0:
                    i = q + j
                    break
                q += len(chunk)
        if i < 0:
            raise self.error(f"{what}: line not terminated before the end of the input (truncated?)")
        self.pos = i + 1
        return bytes(self.data[p:i])

    def _u(self, fmt: str, n: int, what: str) -> int:
        return int(struct.unpack(fmt, self.read(n, what))[0])

    # -- stack -------------------------------------------------------------------------------

    def push(self, value: Any) -> None:
        stack = self.stack
        if len(stack) >= self.limits.max_stack:
            raise self.limit(f"more than {self.limits.max_stack} values on the stack")
        self.objects += 1
        if self.objects > self.limits.max_objects:
            raise self.limit(f"more than {self.limits.max_objects} values in one pickle")
        stack.append(value)

    def charge(self, nbytes: int) -> None:
        """Count `nbytes` of objects made: a container can cost far more than the opcode that makes it
        (an empty set is 216 bytes from one byte), so the memory budget counts objects, not input."""
        self.spent += nbytes
        if self.spent > self.budget:
            raise self.limit(f"the pickle builds more than {self.limits.max_object_bytes} bytes of objects "
                             f"per input byte ({self.spent} bytes so far)")

    def pop(self) -> Any:
        if not self.stack:
            raise self.error("stack underflow (or a value popped across a MARK)")
        return self.stack.pop()

    def top(self) -> Any:
        if not self.stack:
            raise self.error("stack underflow")
        return self.stack[-1]

    def pop_mark(self) -> list[Any]:
        if not self.metastack:
            raise self.error("MARK expected but none is open")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    # -- driver ------------------------------------------------------------------------------

    def load(self) -> Any:
        """Run until STOP and return the pickled value; the memo and stacks are dropped then."""
        table = _OPS
        data = self.data
        end = self.end
        while True:
            p = self.pos
            if p >= end:
                raise self.error("input ended before STOP (truncated pickle)")
            self._op_pos = p
            code = data[p]
            self.pos = p + 1
            fn = table[code]
            if fn is None:
                raise self.error(f"unknown opcode 0x{code:02x}")
            fn(self)
            if self._done:
                result = self._result
                self._result = None
                # the result keeps what it references; the rest of the interpreter's objects go now
                self.memo = {}
                self._hashes = {}
                self._dims = {}
                self._tails = {}
                self.stack = []
                self.metastack = []
                return result

    # -- globals and calls -------------------------------------------------------------------

    def resolve_global(self, module: str, name: str) -> Any:
        module = _MODULE_ALIASES.get(module, module)
        if len(module) > 256 or len(name) > 256:
            raise self.error("global name too long")
        value = _resolve(module, name)
        if value is None:
            qual = f"{module}.{name}"
            self.opaque.add(qual)
            return Opaque(qual)
        return value

    def call(self, callee: Any, args: Any, kwargs: Any, how: str) -> Any:
        """Apply an allow-listed handler, make a `Placeholder` for another class, or refuse with a
        typed error naming the callee."""
        if isinstance(callee, Opaque):
            if callee.name in _COPYREG_CONSTRUCTORS:  # copyreg builds an instance of its first argument
                first = args[0] if isinstance(args, (tuple, list)) and args else None
                if isinstance(first, Opaque) and not _is_gadget(first.name):
                    return self.placeholder(first)
                raise self.refuse(first.name if isinstance(first, (Opaque, TorchType)) else callee.name,
                                  f"{how} via {callee.name}")
            if _is_gadget(callee.name):
                raise self.refuse(callee.name, how)
            return self.placeholder(callee)
        if isinstance(callee, Placeholder):
            raise self.unsafe(f"refusing to call a '{callee.name}' object ({how}): migrator never runs code "
                              "from a pickle")
        if isinstance(args, list):
            args = tuple(args)
        elif not isinstance(args, tuple):
            raise self.error(f"{how}: arguments must be a tuple, got {_tname(args)}")
        if kwargs is None:
            kwargs = {}
        elif not isinstance(kwargs, dict):
            raise self.error(f"{how}: keyword arguments must be a dict, got {_tname(kwargs)}")
        if isinstance(callee, Builtin):
            if callee.call is None:
                raise self.unsafe(f"{how} asks to call {callee.name}, which is data, not a constructor")
            return callee.call(self, args, kwargs)
        if isinstance(callee, (TorchType, StorageType, TorchDtype)):
            if isinstance(callee, TorchType) and callee.name in _TENSOR_WRAPPERS and args:
                return _as_tensor(self, args[0], callee.name)
            raise self.refuse(callee.name, how)
        raise self.unsafe(f"{how} asks to call a {_tname(callee)}, which is not callable")

    def placeholder(self, cls: Opaque) -> Placeholder:
        """The inert stand-in for an instance of `cls` (its arguments are dropped, never used)."""
        self.placeholders += 1
        self.charge(_PLACEHOLDER_SIZE)
        return Placeholder(cls.name, cls.module or cls.name.startswith("torch.nn.modules."))

    def refuse(self, name: str, how: str) -> UnsafePickleError:
        return self.unsafe(
            f"refusing to call '{name}' ({how}): migrator never runs code from a pickle; only "
            "tensors, containers and plain values are read"
        )

    # -- helpers for handlers ------------------------------------------------------------------

    def hash_counts(self, target: Any) -> dict[int, int]:
        """How many non-string keys of `target` (a dict or set being filled) have each hash value.

        Python's dict and set cost grows with the square of the keys sharing one hash, and a file can
        choose integers (multiples of 2**61-1), floats or tuples that do; strings and bytes hash with a
        per-process secret. The entry keeps `target` alive, so its id cannot be reused meanwhile.
        """
        entry = self._hashes.get(id(target))
        if entry is None:
            entry = self._hashes[id(target)] = (target, {})
        return entry[1]

    def key(self, key: Any, counts: dict[int, int], target: Any) -> Any:
        """`check_key`, and at most `max_same_hash` distinct keys with one hash value in `target`
        (a key already in it adds nothing; looking it up costs at most that many probes)."""
        if type(key) is str:
            return key
        self.check_key(key)
        if type(key) is bytes or key in target:
            return key
        h = hash(key)
        n = counts.get(h, 0) + 1
        if n > self.limits.max_same_hash:
            raise self.limit(f"more than {self.limits.max_same_hash} keys of one dict or set share a hash "
                             "value (a hash-collision attack?)")
        counts[h] = n
        return key

    def check_key(self, key: Any) -> Any:
        """Dict keys and set members must be plainly hashable, without deep tuple nesting."""
        if type(key) is str:  # nearly every key (and always hashable)
            return key
        todo = [(key, 0)]
        while todo:
            k, depth = todo.pop()
            if depth > self.limits.max_key_depth:
                raise self.limit(f"dict key / set member nested deeper than {self.limits.max_key_depth}")
            if isinstance(k, (tuple, frozenset)):
                todo.extend((x, depth + 1) for x in k)
            elif isinstance(k, (list, dict, set, bytearray)):
                raise self.error(f"unhashable {_tname(k)} used as a dict key or set member")
        try:
            hash(key)
        except TypeError as e:
            raise self.error(f"unhashable dict key or set member: {e}") from None
        return key


def _tname(v: Any) -> str:
    if isinstance(v, Opaque):
        return f"opaque object {v.name}"
    if isinstance(v, Placeholder):
        return f"'{v.name}' object"
    return type(v).__name__


def _is_gadget(name: str) -> bool:
    """Globals whose call could run code under pickle: refused at once, never a placeholder.

    Anything in a code-running module of the standard library, and torch's functions (torch's
    classes outside the allow-list, such as `torch.nn` modules, become placeholders).
    """
    module, _, short = name.rpartition(".")
    top = module.split(".")[0]
    if top in _DANGEROUS_MODULES:
        return True
    return top == "torch" and not short[:1].isupper()


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


# --------------------------------------------------------------------------------------------
# Opcode handlers


def _op(code: bytes) -> Callable[[Callable[[Unpickler], None]], Callable[[Unpickler], None]]:
    def deco(fn: Callable[[Unpickler], None]) -> Callable[[Unpickler], None]:
        _DISPATCH[code[0]] = fn
        return fn

    return deco


_DISPATCH: dict[int, Callable[[Unpickler], None]] = {}


@_op(b"\x80")
def _proto(m: Unpickler) -> None:
    v = m.read(1, "PROTO")[0]
    if v > 5:
        raise m.error(f"unsupported pickle protocol {v} (0-5 are known)")
    if m.protocol is None:
        m.protocol = v


@_op(b"\x95")
def _frame(m: Unpickler) -> None:
    n = m._u("<Q", 8, "FRAME")
    if n > m.end - m.pos:
        raise m.error(f"FRAME declares {n} bytes but only {m.end - m.pos} remain (truncated?)")


@_op(b".")
def _stop(m: Unpickler) -> None:
    m._result = m.pop()
    m._done = True


@_op(b"(")
def _mark(m: Unpickler) -> None:
    stack = m.stack
    if stack and stack[-1] is _REBUILD_V2 and m.fast:
        q = _fast_rebuild_v2(m, m.pos - 1)
        if q >= 0:
            m.pos = q
            return
    if len(m.metastack) >= m.limits.max_marks:
        raise m.limit(f"more than {m.limits.max_marks} nested MARKs")
    m.metastack.append(m.stack)
    m.stack = []


@_op(b"0")
def _pop(m: Unpickler) -> None:
    if m.stack:
        m.stack.pop()
    else:
        m.pop_mark()


@_op(b"1")
def _pop_mark(m: Unpickler) -> None:
    m.pop_mark()


@_op(b"2")
def _dup(m: Unpickler) -> None:
    m.push(m.top())


# -- constants and numbers


@_op(b"N")
def _none(m: Unpickler) -> None:
    m.push(None)


@_op(b"\x88")
def _true(m: Unpickler) -> None:
    m.push(True)


@_op(b"\x89")
def _false(m: Unpickler) -> None:
    m.push(False)


def _parse_int(m: Unpickler, text: bytes, what: str) -> int:
    if len(text) > m.limits.max_long_bytes:
        raise m.limit(f"{what} has {len(text)} digits (limit {m.limits.max_long_bytes})")
    try:
        return int(text.decode("ascii"), 0)
    except (UnicodeDecodeError, ValueError):
        raise m.error(f"{what}: invalid integer literal") from None


@_op(b"I")
def _int(m: Unpickler) -> None:
    text = m.readline("INT")
    if text == b"00":
        m.push(False)
    elif text == b"01":
        m.push(True)
    else:
        m.push(_parse_int(m, text, "INT"))


@_op(b"L")
def _long(m: Unpickler) -> None:
    text = m.readline("LONG")
    if text.endswith(b"L"):
        text = text[:-1]
    m.push(_parse_int(m, text, "LONG"))


@_op(b"J")
def _binint(m: Unpickler) -> None:
    m.push(m._u("<i", 4, "BININT"))


@_op(b"K")
def _binint1(m: Unpickler) -> None:
    p = m.pos
    if p < m.end:
        m.pos = p + 1
        m.push(m.data[p])
    else:
        m.push(m.read(1, "BININT1")[0])


@_op(b"M")
def _binint2(m: Unpickler) -> None:
    m.push(m._u("<H", 2, "BININT2"))


@_op(b"\x8a")
def _long1(m: Unpickler) -> None:
    n = m.read(1, "LONG1")[0]
    m.push(int.from_bytes(m.read(n, "LONG1"), "little", signed=True))


@_op(b"\x8b")
def _long4(m: Unpickler) -> None:
    n = m._u("<i", 4, "LONG4")
    if n < 0:
        raise m.error("LONG4 with a negative length")
    if n > m.limits.max_long_bytes:
        raise m.limit(f"LONG4 of {n} bytes (limit {m.limits.max_long_bytes})")
    m.push(int.from_bytes(m.read(n, "LONG4"), "little", signed=True))


@_op(b"F")
def _float(m: Unpickler) -> None:
    text = m.readline("FLOAT")
    if len(text) > 1024:
        raise m.limit("FLOAT literal longer than 1024 characters")
    try:
        m.push(float(text.decode("ascii")))
    except (UnicodeDecodeError, ValueError):
        raise m.error("FLOAT: invalid literal") from None


@_op(b"G")
def _binfloat(m: Unpickler) -> None:
    m.push(struct.unpack(">d", m.read(8, "BINFLOAT"))[0])


# -- strings and bytes


def _decode(m: Unpickler, raw: bytes, what: str, encoding: str = "utf-8", errors: str = "strict") -> str:
    try:
        return raw.decode(encoding, errors)
    except UnicodeDecodeError:
        raise m.error(f"{what}: invalid {encoding} text") from None


@_op(b"S")
def _string(m: Unpickler) -> None:
    import codecs

    raw = m.readline("STRING")
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[:1] in (b"'", b'"'):
        raw = raw[1:-1]
    else:
        raise m.error("STRING: the literal is not quoted")
    try:
        value = codecs.escape_decode(raw)[0]
    except ValueError:
        raise m.error("STRING: invalid escape") from None
    m.push(_decode(m, value, "STRING"))  # torch.load decodes Python 2 strings as UTF-8


@_op(b"T")
def _binstring(m: Unpickler) -> None:
    n = m._u("<i", 4, "BINSTRING")
    m.push(_decode(m, m.read(n, "BINSTRING"), "BINSTRING"))


@_op(b"U")
def _short_binstring(m: Unpickler) -> None:
    n = m.read(1, "SHORT_BINSTRING")[0]
    m.push(_decode(m, m.read(n, "SHORT_BINSTRING"), "SHORT_BINSTRING"))


@_op(b"V")
def _unicode(m: Unpickler) -> None:
    m.push(_decode(m, m.readline("UNICODE"), "UNICODE", "raw-unicode-escape"))


@_op(b"X")
def _binunicode(m: Unpickler) -> None:
    p, data = m.pos, m.data
    if p + 4 <= m.end:
        q = p + 4 + _U32.unpack_from(data, p)[0]
        if q <= m.end:  # in bounds: decode straight from the input, no intermediate copy
            m.pos = q
            try:
                text = str(data[p + 4 : q], "utf-8", "surrogatepass")
            except UnicodeDecodeError:
                raise m.error("BINUNICODE: invalid utf-8 text") from None
            m.push(text)
            return
    n = m._u("<I", 4, "BINUNICODE")
    m.push(_decode(m, m.read(n, "BINUNICODE"), "BINUNICODE", errors="surrogatepass"))


@_op(b"\x8c")
def _short_binunicode(m: Unpickler) -> None:
    n = m.read(1, "SHORT_BINUNICODE")[0]
    m.push(_decode(m, m.read(n, "SHORT_BINUNICODE"), "SHORT_BINUNICODE", errors="surrogatepass"))


@_op(b"\x8d")
def _binunicode8(m: Unpickler) -> None:
    n = m._u("<Q", 8, "BINUNICODE8")
    m.push(_decode(m, m.read(n, "BINUNICODE8"), "BINUNICODE8", errors="surrogatepass"))


@_op(b"B")
def _binbytes(m: Unpickler) -> None:
    m.push(m.read(m._u("<I", 4, "BINBYTES"), "BINBYTES"))


@_op(b"C")
def _short_binbytes(m: Unpickler) -> None:
    m.push(m.read(m.read(1, "SHORT_BINBYTES")[0], "SHORT_BINBYTES"))


@_op(b"\x8e")
def _binbytes8(m: Unpickler) -> None:
    m.push(m.read(m._u("<Q", 8, "BINBYTES8"), "BINBYTES8"))


@_op(b"\x96")
def _bytearray8(m: Unpickler) -> None:
    m.push(bytearray(m.read(m._u("<Q", 8, "BYTEARRAY8"), "BYTEARRAY8")))


@_op(b"\x97")
def _next_buffer(m: Unpickler) -> None:
    raise m.error("NEXT_BUFFER: out-of-band buffers are not supported in checkpoint files")


@_op(b"\x98")
def _readonly_buffer(m: Unpickler) -> None:
    raise m.error("READONLY_BUFFER: out-of-band buffers are not supported in checkpoint files")


# -- containers


@_op(b")")
def _empty_tuple(m: Unpickler) -> None:
    m.push(())


@_op(b"t")
def _tuple(m: Unpickler) -> None:
    m.push(tuple(m.pop_mark()))


@_op(b"\x85")
def _tuple1(m: Unpickler) -> None:
    a = m.pop()
    m.push((a,))


@_op(b"\x86")
def _tuple2(m: Unpickler) -> None:
    b = m.pop()
    a = m.pop()
    m.push((a, b))


@_op(b"\x87")
def _tuple3(m: Unpickler) -> None:
    c = m.pop()
    b = m.pop()
    a = m.pop()
    m.push((a, b, c))


@_op(b"]")
def _empty_list(m: Unpickler) -> None:
    m.push([])


@_op(b"l")
def _list(m: Unpickler) -> None:
    m.push(m.pop_mark())


@_op(b"a")
def _append(m: Unpickler) -> None:
    v = m.pop()
    target = m.top()
    if not isinstance(target, list):
        if isinstance(target, Placeholder):
            return  # a list subclass's items: dropped with the object
        raise m.error(f"APPEND to a {_tname(target)}")
    target.append(v)


@_op(b"e")
def _appends(m: Unpickler) -> None:
    items = m.pop_mark()
    target = m.top()
    if not isinstance(target, list):
        if isinstance(target, Placeholder):
            return
        raise m.error(f"APPENDS to a {_tname(target)}")
    target.extend(items)


@_op(b"}")
def _empty_dict(m: Unpickler) -> None:
    m.push({})


def _set_pairs(m: Unpickler, target: dict, items: list[Any], what: str) -> None:  # type: ignore[type-arg]
    if len(items) % 2:
        raise m.error(f"{what} with an odd number of items")
    keys = items[::2]
    if all(type(k) is str for k in keys):  # a state_dict's batch: nothing to check, one C-level update
        target.update(zip(keys, items[1::2], strict=True))
        return
    counts = m.hash_counts(target)
    for i in range(0, len(items), 2):
        target[m.key(items[i], counts, target)] = items[i + 1]


@_op(b"d")
def _dict(m: Unpickler) -> None:
    d: dict[Any, Any] = {}
    _set_pairs(m, d, m.pop_mark(), "DICT")
    m.push(d)


@_op(b"s")
def _setitem(m: Unpickler) -> None:
    value = m.pop()
    key = m.pop()
    target = m.top()
    if not isinstance(target, dict):
        if isinstance(target, Placeholder):
            return  # a dict subclass's items (Lightning's AttributeDict): dropped with the object
        raise m.error(f"SETITEM on a {_tname(target)}")
    target[m.key(key, m.hash_counts(target), target) if type(key) is not str else key] = value


@_op(b"u")
def _setitems(m: Unpickler) -> None:
    items = m.pop_mark()
    target = m.top()
    if not isinstance(target, dict):
        if isinstance(target, Placeholder):
            return
        raise m.error(f"SETITEMS on a {_tname(target)}")
    _set_pairs(m, target, items, "SETITEMS")


@_op(b"\x8f")
def _empty_set(m: Unpickler) -> None:
    m.charge(_SET_SIZE)
    m.push(set())


@_op(b"\x90")
def _additems(m: Unpickler) -> None:
    items = m.pop_mark()
    target = m.top()
    if not isinstance(target, set):
        if isinstance(target, Placeholder):
            return
        raise m.error(f"ADDITEMS on a {_tname(target)}")
    counts = m.hash_counts(target)
    for x in items:
        target.add(m.key(x, counts, target))


@_op(b"\x91")
def _frozenset(m: Unpickler) -> None:
    m.push(_make_frozenset(m, m.pop_mark()))


def _make_frozenset(m: Unpickler, items: list[Any]) -> frozenset:  # type: ignore[type-arg]
    m.charge(_SET_SIZE)
    counts: dict[int, int] = {}
    members: set[Any] = set()
    for x in items:
        members.add(m.key(x, counts, members))
    return frozenset(members)


# -- memo


def _memo_put(m: Unpickler, idx: int) -> None:
    if not 0 <= idx < 1 << 32:  # what LONG_BINPUT can write; also below 2**61-1, so no two share a hash
        raise m.error("memo index outside 0..2**32-1")
    if idx not in m.memo and len(m.memo) >= m.limits.max_memo:
        raise m.limit(f"more than {m.limits.max_memo} memo entries")
    m.memo[idx] = m.top()


def _memo_get(m: Unpickler, idx: int) -> None:
    try:
        value = m.memo[idx]
    except KeyError:
        raise m.error(f"memo entry {describe(idx)} read before it was written") from None
    m.push(value)


@_op(b"p")
def _put(m: Unpickler) -> None:
    _memo_put(m, _parse_int(m, m.readline("PUT"), "PUT"))


@_op(b"q")
def _binput(m: Unpickler) -> None:
    p = m.pos
    if p < m.end and m.stack:
        idx = m.data[p]
        memo = m.memo
        if idx in memo or len(memo) < m.limits.max_memo:
            m.pos = p + 1
            memo[idx] = m.stack[-1]
            return
    _memo_put(m, m.read(1, "BINPUT")[0])


@_op(b"r")
def _long_binput(m: Unpickler) -> None:
    _memo_put(m, m._u("<I", 4, "LONG_BINPUT"))


@_op(b"\x94")
def _memoize(m: Unpickler) -> None:
    m.charge(_MEMO_ENTRY)  # one byte, one new memo entry: the only memo write that can outgrow the budget
    _memo_put(m, len(m.memo))


@_op(b"g")
def _get(m: Unpickler) -> None:
    _memo_get(m, _parse_int(m, m.readline("GET"), "GET"))


@_op(b"h")
def _binget(m: Unpickler) -> None:
    p = m.pos
    if p < m.end:
        m.pos = p + 1
        _memo_get(m, m.data[p])
    else:
        _memo_get(m, m.read(1, "BINGET")[0])


@_op(b"j")
def _long_binget(m: Unpickler) -> None:
    _memo_get(m, m._u("<I", 4, "LONG_BINGET"))


# -- globals, calls, objects


def _line_name(m: Unpickler, what: str) -> str:
    return _decode(m, m.readline(what), what)


@_op(b"c")
def _global(m: Unpickler) -> None:
    module = _line_name(m, "GLOBAL")
    name = _line_name(m, "GLOBAL")
    m.push(m.resolve_global(module, name))


@_op(b"\x93")
def _stack_global(m: Unpickler) -> None:
    name = m.pop()
    module = m.pop()
    if not isinstance(module, str) or not isinstance(name, str):
        raise m.error("STACK_GLOBAL needs two strings")
    m.push(m.resolve_global(module, name))


@_op(b"R")
def _reduce(m: Unpickler) -> None:
    args = m.pop()
    callee = m.pop()
    m.push(m.call(callee, args, None, "REDUCE"))


@_op(b"\x81")
def _newobj(m: Unpickler) -> None:
    args = m.pop()
    cls = m.pop()
    m.push(m.call(cls, args, None, "NEWOBJ"))


@_op(b"\x92")
def _newobj_ex(m: Unpickler) -> None:
    kwargs = m.pop()
    args = m.pop()
    cls = m.pop()
    m.push(m.call(cls, args, kwargs, "NEWOBJ_EX"))


@_op(b"i")
def _inst(m: Unpickler) -> None:
    module = _line_name(m, "INST")
    name = _line_name(m, "INST")
    args = tuple(m.pop_mark())
    m.push(m.call(m.resolve_global(module, name), args, None, "INST"))


@_op(b"o")
def _obj(m: Unpickler) -> None:
    items = m.pop_mark()
    if not items:
        raise m.error("OBJ without a class")
    m.push(m.call(items[0], tuple(items[1:]), None, "OBJ"))


@_op(b"b")
def _build(m: Unpickler) -> None:
    state = m.pop()
    obj = m.top()
    _apply_state(m, obj, state)


@_op(b"P")
def _persid(m: Unpickler) -> None:
    pid = _decode(m, m.readline("PERSID"), "PERSID", "ascii")
    m.push(_persistent(m, pid))


@_op(b"Q")
def _binpersid(m: Unpickler) -> None:
    m.push(_persistent(m, m.pop()))


def _persistent(m: Unpickler, pid: Any) -> Any:
    if m.persistent_load is None:
        raise m.error("a persistent id references tensor data, but this pickle has no data section "
                      "(a plain pickle is not a PyTorch checkpoint)")
    return m.persistent_load(pid)


for _code in (b"\x82", b"\x83", b"\x84"):

    @_op(_code)
    def _ext(m: Unpickler) -> None:
        raise m.unsafe("extension-registry opcodes (EXT1/EXT2/EXT4) name code by number; refused")


def _apply_state(m: Unpickler, obj: Any, state: Any) -> None:
    """BUILD: only our own placeholders take state; nothing's __setstate__ is ever called."""
    if isinstance(obj, ODict):
        slots = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        for part in (state, slots):
            if part is None:
                continue
            if not isinstance(part, dict):
                raise m.error(f"BUILD on an OrderedDict with a {_tname(part)} state")
            for k, v in part.items():
                if not isinstance(k, str):
                    raise m.error("BUILD state keys must be strings")
                obj.attrs[k] = v
    elif isinstance(obj, (TensorRef, UnsupportedTensor)):
        return  # Tensor.__setstate__ state (requires_grad, hooks) carries no data
    elif isinstance(obj, NumpyDtype):
        if isinstance(state, tuple) and len(state) >= 2 and state[1] in ("<", ">", "|", "="):
            obj.byteorder = state[1]
        else:
            raise m.error("BUILD on numpy.dtype with an unexpected state")
    elif isinstance(obj, NumpyArray):
        if isinstance(state, tuple) and len(state) == 5 and isinstance(state[1], tuple):
            obj.shape = _shape_arg(m, state[1], "numpy.ndarray shape")
            obj.dtype = state[2] if isinstance(state[2], NumpyDtype) else None
        else:
            raise m.error("BUILD on numpy.ndarray with an unexpected state")
    elif isinstance(obj, Placeholder):  # the state is dropped: only whether it is a module's matters
        if isinstance(state, tuple) and len(state) == 2:
            state = state[0]
        if isinstance(state, dict) and ("_modules" in state or "_parameters" in state):
            obj.module = True
    elif isinstance(obj, Opaque):
        obj.state = state  # kept as data only
    elif isinstance(obj, (Builtin, TorchDtype, StorageType, TorchType)):
        raise m.unsafe(f"BUILD would modify the global {getattr(obj, 'name', '?')}; refused")
    elif state is not None:
        raise m.error(f"BUILD on a {_tname(obj)}")


_OPS: list[Callable[[Unpickler], None] | None] = [_DISPATCH.get(i) for i in range(256)]
"""`_DISPATCH` as a list indexed by opcode: the main loop's lookup."""


# --------------------------------------------------------------------------------------------
# The fast path for torch's tensor records
#
# torch.save writes every tensor as the same ~20 opcodes:
#   <callee> ( ( 'storage' <StorageType> <key> <location> <numel> t Q <offset> <size> <stride>
#   <requires_grad> <OrderedDict> ) R t R      (each value optionally followed by BINPUT)
# `_fast_rebuild_v2` reads such a record in two phases. The scan touches no state: it parses the
# bytes, resolves memo reads and allow-listed globals, and checks that no limit could be reached;
# on anything unexpected it gives up (-1) and the general loop interprets the same bytes, raising
# its own errors. The commit then does what the general loop would have done, in the same order:
# persistent_load, the tensor's checks, the memo writes, the object count, the stack.

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")


class _Reject(Exception):
    """The record is not in the shape the fast path reads: interpret it op by op.

    Raised each time: a shared one would keep the traceback of its last raise, and
    with it the frames of the whole open (the reader's frame holds the unpickled root until it returns).
    """

_P_STORAGE, _P_HOOKS, _P_ARGS, _P_TENSOR = (object() for _ in range(4))  # values made by the commit
_INT_OPS = frozenset({0x4B, 0x4D, 0x4A, 0x8A})


def _scan_int(data: Any, p: int) -> tuple[int, int]:
    c = data[p]
    if c == 0x4B:  # BININT1
        return data[p + 1], p + 2
    if c == 0x4D:  # BININT2
        return _U16.unpack_from(data, p + 1)[0], p + 3
    if c == 0x4A:  # BININT
        return _I32.unpack_from(data, p + 1)[0], p + 5
    if c == 0x8A:  # LONG1 (at most 255 bytes)
        n = data[p + 1]
        return int.from_bytes(data[p + 2 : p + 2 + n], "little", signed=True), p + 2 + n
    raise _Reject


def _scan_put(data: Any, p: int, puts: list[tuple[int, Any]], value: Any) -> int:
    while True:
        c = data[p]
        if c == 0x71:  # BINPUT
            puts.append((data[p + 1], value))
            p += 2
        elif c == 0x72:  # LONG_BINPUT
            puts.append((_U32.unpack_from(data, p + 1)[0], value))
            p += 5
        elif c == 0x94:  # MEMOIZE: its index depends on the memo's size as it grows
            raise _Reject
        else:
            return p


def _scan_get(data: Any, p: int, memo: dict[int, Any], puts: list[tuple[int, Any]]) -> tuple[Any, int]:
    if data[p] == 0x68:  # BINGET
        idx, p = data[p + 1], p + 2
    else:  # LONG_BINGET
        idx, p = _U32.unpack_from(data, p + 1)[0], p + 5
    if idx not in memo:
        raise _Reject
    for i, _ in puts:  # written earlier in this record: not in the memo yet
        if i == idx:
            raise _Reject
    return memo[idx], p


def _scan_global(data: Any, p: int, end: int) -> tuple[Any, int]:
    """GLOBAL naming an allow-listed object (resolving others records them: the general loop does it)."""
    if not isinstance(data, bytes):
        raise _Reject
    i = data.find(b"\n", p + 1, end)
    j = data.find(b"\n", i + 1, end) if i >= 0 else -1
    if j < 0:
        raise _Reject
    module = data[p + 1 : i].decode("utf-8")
    value = _resolve(_MODULE_ALIASES.get(module, module), data[i + 1 : j].decode("utf-8"))
    if value is None:  # not allow-listed, or too long to be (the general loop raises or records it)
        raise _Reject
    return value, j + 1


def _scan_item(data: Any, p: int, end: int, memo: dict[int, Any], puts: list[tuple[int, Any]]) -> tuple[Any, int]:
    """One field of a persistent id: a string, an integer, None, a memo read or a global."""
    c = data[p]
    if c == 0x58:  # BINUNICODE
        q = p + 5 + _U32.unpack_from(data, p + 1)[0]
        if q > end:
            raise _Reject
        return str(data[p + 5 : q], "utf-8", "surrogatepass"), q
    if c == 0x8C:  # SHORT_BINUNICODE
        q = p + 2 + data[p + 1]
        if q > end:
            raise _Reject
        return str(data[p + 2 : q], "utf-8", "surrogatepass"), q
    if c == 0x68 or c == 0x6A:
        return _scan_get(data, p, memo, puts)
    if c == 0x63:
        return _scan_global(data, p, end)
    if c == 0x4E:  # NONE
        return None, p + 1
    return _scan_int(data, p)


def _valid_dims(dims: Any, max_dims: int) -> bool:
    """What `_shape_arg` accepts without an error, for tuples."""
    if type(dims) is not tuple or len(dims) > max_dims:
        return False
    return all(type(d) is int and 0 <= d < _INT64_LIMIT for d in dims)


def _scan_dims(data: Any, p: int, memo: dict[int, Any], puts: list[tuple[int, Any]],
               max_dims: int) -> tuple[tuple[int, ...], int, int]:
    """A size or stride tuple: (value, next position, values the general loop would push)."""
    c = data[p]
    if c == 0x29:  # EMPTY_TUPLE
        return (), p + 1, 1
    if c == 0x68 or c == 0x6A:
        dims, p = _scan_get(data, p, memo, puts)
        if not _valid_dims(dims, max_dims):
            raise _Reject
        return dims, p, 1
    vals = []
    if c == 0x28:  # MARK ints TUPLE (4 dimensions or more)
        p += 1
        while data[p] != 0x74:
            v, p = _scan_int(data, p)
            vals.append(v)
            if len(vals) > max_dims:
                raise _Reject
    else:  # 1 to 3 ints, then TUPLE1/2/3
        while True:
            c = data[p]
            if c in _INT_OPS and len(vals) < 3:
                v, p = _scan_int(data, p)
                vals.append(v)
            elif 0x85 <= c <= 0x87 and c - 0x84 == len(vals):
                break
            else:
                raise _Reject
    dims = tuple(vals)
    if not _valid_dims(dims, max_dims):
        raise _Reject
    return dims, p + 1, len(vals) + 1


_PUT_OPS = frozenset({0x71, 0x72, 0x94})
_NAME_OPS = frozenset({0x58, 0x8C})
_Plan = tuple[int, tuple[Any, ...], int, int, tuple[int, ...], tuple[int, ...], bool, int, int]


def _scan_record(m: Unpickler, p: int, puts: list[tuple[int, Any]]) -> _Plan:
    """Phase 1 for the record whose args MARK is at `p`: parse only, raising _Reject on anything unusual.

    Returns (end, persistent id, its position, offset, size, stride, requires_grad, REDUCE position,
    values pushed); memo writes are appended to `puts`.
    """
    data, end, memo = m.data, m.end, m.memo
    max_dims = m.limits.max_dims
    if data[p + 1] != 0x28:
        raise _Reject
    q = p + 2
    fields = []
    while data[q] != 0x74:
        v, q = _scan_item(data, q, end, memo, puts)
        fields.append(v)
        if len(fields) > 6:
            raise _Reject
        if data[q] in _PUT_OPS:
            q = _scan_put(data, q, puts, v)
    pid = tuple(fields)
    q += 1
    if data[q] in _PUT_OPS:
        q = _scan_put(data, q, puts, pid)
    if data[q] != 0x51:  # BINPERSID
        raise _Reject
    persid_pos = q
    q += 1
    if data[q] in _PUT_OPS:
        q = _scan_put(data, q, puts, _P_STORAGE)
    offset, q = _scan_int(data, q)
    if offset < 0 or offset >= _INT64_LIMIT:
        raise _Reject
    if data[q] in _PUT_OPS:
        q = _scan_put(data, q, puts, offset)
    size, q, n_size = _scan_dims(data, q, memo, puts, max_dims)
    if data[q] in _PUT_OPS:
        q = _scan_put(data, q, puts, size)
    stride, q, n_stride = _scan_dims(data, q, memo, puts, max_dims)
    if data[q] in _PUT_OPS:
        q = _scan_put(data, q, puts, stride)
    if len(size) != len(stride) or max(n_size, n_stride) > m.limits.max_stack:
        raise _Reject
    c = data[q]
    if c != 0x88 and c != 0x89:  # NEWTRUE / NEWFALSE
        raise _Reject
    requires_grad = c == 0x88
    q += 1
    if data[q] in _PUT_OPS:
        q = _scan_put(data, q, puts, requires_grad)
    c = data[q]
    if c == 0x68 or c == 0x6A:
        callee, q = _scan_get(data, q, memo, puts)
    elif c == 0x63:
        callee, q = _scan_global(data, q, end)
    else:
        raise _Reject
    if callee is not _ORDERED_DICT:
        raise _Reject
    if data[q] in _PUT_OPS:
        q = _scan_put(data, q, puts, callee)
    if data[q] != 0x29 or data[q + 1] != 0x52:  # EMPTY_TUPLE REDUCE: OrderedDict()
        raise _Reject
    q += 2
    if data[q] in _PUT_OPS:
        q = _scan_put(data, q, puts, _P_HOOKS)
    if data[q] != 0x74:  # TUPLE: the 6 arguments
        raise _Reject
    q += 1
    if data[q] in _PUT_OPS:
        q = _scan_put(data, q, puts, _P_ARGS)
    if data[q] != 0x52:  # REDUCE
        raise _Reject
    reduce_pos = q
    q += 1
    if data[q] in _PUT_OPS:
        q = _scan_put(data, q, puts, _P_TENSOR)
    if q > end:
        raise _Reject
    # fields + their tuple, storage, offset, size, stride, requires_grad, OrderedDict + () + REDUCE, args, REDUCE
    return (q, pid, persid_pos, offset, size, stride, requires_grad, reduce_pos,
            len(fields) + n_size + n_stride + 9)


def _room(m: Unpickler, pushes: int, puts: list[tuple[int, Any]]) -> bool:
    """No limit can be reached by `pushes` more values and these memo writes."""
    lim, memo = m.limits, m.memo
    if m.objects + pushes > lim.max_objects:
        return False
    if not puts or len(memo) + len(puts) <= lim.max_memo:  # the common case, without counting new indices
        return True
    return len(memo) + len({i for i, _ in puts if i not in memo}) <= lim.max_memo


def _commit(m: Unpickler, plan: _Plan, puts: list[tuple[int, Any]]) -> None:
    """Phase 2: what the general loop does at BINPERSID, the two REDUCEs and the memo writes, in order."""
    _end, pid, persid_pos, offset, size, stride, requires_grad, reduce_pos, pushes = plan
    m.objects += pushes
    m._op_pos = persid_pos
    storage = m.persistent_load(pid)  # type: ignore[misc]
    m._op_pos = reduce_pos
    if not isinstance(storage, StorageRef):
        _tensor(m, "_rebuild_tensor_v2", storage, offset, size, stride)  # raises the general loop's error
    t = TensorRef(storage, offset, size, stride, None, requires_grad)
    if puts:
        _write_memo(m.memo, puts, storage, t)
    m.stack[-1] = t


def _write_memo(memo: dict[int, Any], puts: list[tuple[int, Any]], storage: StorageRef, t: TensorRef) -> None:
    """The record's memo writes, in order; the hooks dict and args tuple are made only if written
    (torch memoizes both; migrator's writer neither, and they are garbage then)."""
    hooks: ODict | None = None
    args: tuple[Any, ...] | None = None
    for idx, v in puts:
        if v is _P_STORAGE:
            v = storage
        elif v is _P_TENSOR:
            v = t
        elif v is _P_HOOKS or v is _P_ARGS:
            if hooks is None:
                hooks = ODict()
            if v is _P_ARGS:
                if args is None:
                    args = (storage, t.offset, t.size, t.stride, t.requires_grad, hooks)
                v = args
            else:
                v = hooks
        memo[idx] = v



# -- the quick scanner: the two record forms seen in practice, in few Python operations
#
# After its first record, a state_dict from torch.save (protocol 2/3) or from migrator's writer repeats
#   <name> [put] h<callee> ( ( h<'storage'> h<class> X<key> [put] h<location> <numel> t [put] Q
#   <offset> <size> [put] <stride> [put] <bool> h<OrderedDict> ) R [put] t [put] R [put]
# with ints as BININT1/BININT2/BININT and memo access by (LONG_)BINGET/(LONG_)BINPUT. The quick
# functions read exactly that and nothing else (they raise _Reject, and `_scan_record` takes over);
# for what they read, their plan and memo writes equal `_scan_record`'s (test_pickle_fastpath).
#
# The part after the key (the "tail") repeats byte for byte between tensors of one shape when it
# holds no memo writes (migrator's writer): a tail parsed once is kept, keyed by its bytes, with
# what it means. Parsing is deterministic, so bytes equal to a parsed tail parse the same way; only
# the memo reads are looked up again for each record.

_QUICK_INTS = frozenset({0x4B, 0x4D, 0x4A})
_PUTS = frozenset({0x71, 0x72})  # BINPUT, LONG_BINPUT (checked before calling _quick_put: most values have none)
_QUICK_CACHE = 4096  # distinct tails (and dims) kept per pickle: a few shapes in practice
_TAIL_END = b")RtR"  # OrderedDict() REDUCE, TUPLE, REDUCE: how a tail without memo writes ends
_TAIL_WINDOW = 128  # longest tail looked up (a 5-d shape with BININT sizes takes ~70 bytes)

_Tail = tuple[int, int, int, int, tuple[int, ...], tuple[int, ...], bool, int, int, int]
"""A parsed tail: (location memo index, numel, BINPERSID offset, storage offset, size, stride, requires_grad,
OrderedDict memo index, REDUCE offset, values pushed); offsets are from the tail's start."""


def _quick_pair(m: Unpickler, q: int) -> tuple[str, Any, _Plan, list[tuple[int, Any]]]:
    """The `name, callee, record` pair at `q`: (name, callee, plan, memo writes), or _Reject."""
    data, memo = m.data, m.memo
    puts: list[tuple[int, Any]] = []
    taken: list[int] = []  # indices written so far in this pair: a read of one must see the new value
    if data[q] != 0x58:  # BINUNICODE
        raise _Reject
    r = q + 5 + _U32.unpack_from(data, q + 1)[0]
    if r > m.end:
        raise _Reject
    raw = data[q + 5 : r]  # bytes.decode costs half of str(raw, ...); a memoryview's slice has no decode
    name = raw.decode("utf-8", "surrogatepass") if type(raw) is bytes else str(raw, "utf-8", "surrogatepass")
    if data[r] in _PUTS:
        r = _quick_put(data, r, name, puts, taken)
    # h<callee> ( ( h<tag> h<class>: torch's first memo entries, read by BINGET
    if (data[r] == 0x68 and data[r + 2] == 0x28 and data[r + 3] == 0x28 and data[r + 4] == 0x68
            and data[r + 6] == 0x68):
        ci, ti, si = data[r + 1], data[r + 5], data[r + 7]
        if taken and (ci in taken or ti in taken or si in taken):
            raise _Reject
        callee = memo[ci]
        if callee is not _REBUILD_V2:
            raise _Reject
        return name, callee, _quick_key(m, r + 8, memo[ti], memo[si], puts, taken), puts
    callee, r = _quick_get(data, r, memo, taken)
    if callee is not _REBUILD_V2 or data[r] != 0x28:
        raise _Reject
    return name, callee, _quick_record(m, r, puts, taken), puts


def _quick_record(m: Unpickler, p: int, puts: list[tuple[int, Any]], taken: list[int]) -> _Plan:
    """`_scan_record` for the record at `p` (its args MARK), in the two usual forms only."""
    data, memo = m.data, m.memo
    if data[p + 1] != 0x28:
        raise _Reject
    tag, q = _quick_get(data, p + 2, memo, taken)
    if data[q] in _PUTS:
        q = _quick_put(data, q, tag, puts, taken)
    stype, q = _quick_get(data, q, memo, taken)
    if data[q] in _PUTS:
        q = _quick_put(data, q, stype, puts, taken)
    return _quick_key(m, q, tag, stype, puts, taken)


def _quick_key(m: Unpickler, q: int, tag: Any, stype: Any, puts: list[tuple[int, Any]], taken: list[int]) -> _Plan:
    """From the storage key (BINUNICODE) to the record's end; the tail from `m._tails` when known."""
    data = m.data
    if data[q] != 0x58:
        raise _Reject
    r = q + 5 + _U32.unpack_from(data, q + 1)[0]
    if r > m.end:
        raise _Reject
    raw = data[q + 5 : r]
    key = raw.decode("utf-8", "surrogatepass") if type(raw) is bytes else str(raw, "utf-8", "surrogatepass")
    s = r
    if data[s] in _PUTS:
        s = _quick_put(data, s, key, puts, taken)
    # the first end mark in the window; a tail only if it ends by m.end (min() would cost ~4% of the load)
    e = data.find(_TAIL_END, s, s + _TAIL_WINDOW) if type(data) is bytes else -1
    tail = m._tails.get(data[s : e + 4]) if 0 <= e <= m.end - 4 else None
    if tail is None:
        if type(data) is bytes and data[s] == 0x68 and data[s + 2] in _QUICK_INTS:
            found = _TORCH_TAIL.match(data, s, m.end)
            if found is not None:
                return _torch_tail(m, found, tag, stype, key, puts, taken)
        return _quick_tail(m, s, tag, stype, key, puts, taken)
    if data[e + 4] in _PUT_OPS:  # the tensor is memoized: `_scan_record` records that write
        raise _Reject
    loc_i, numel, persid_at, offset, size, stride, requires_grad, od_i, reduce_at, pushes = tail
    if taken and (loc_i in taken or od_i in taken):
        raise _Reject
    memo = m.memo
    if memo[od_i] is not _ORDERED_DICT:
        raise _Reject
    pid = (tag, stype, key, memo[loc_i], numel)
    return (e + 4, pid, s + persid_at, offset, size, stride, requires_grad, s + reduce_at, pushes)


_INT = rb"(?:K.|M..|J....)"
_DIMS = rb"(\)|" + _INT + rb"\x85|" + _INT + rb"{2}\x86|" + _INT + rb"{3}\x87)"
_TORCH_TAIL = re.compile(
    rb"h(.)(" + _INT + rb")tr(....)Q(" + _INT + rb")" + _DIMS + rb"r(....)" + _DIMS + rb"r(....)([\x88\x89])"
    rb"h(.)\)Rr(....)tr(....)Rr(....)", re.DOTALL)
"""A tail as torch.save writes it once its memo passes 255 entries: every value memoized by LONG_BINPUT,
ints as BININT1/2/BININT, up to 3 dimensions; the fields and memo indices are its groups."""


def _torch_tail(m: Unpickler, found: re.Match[bytes], tag: Any, stype: Any, key: str,
                puts: list[tuple[int, Any]], taken: list[int]) -> _Plan:
    """`_quick_tail` for a `_TORCH_TAIL` match (one C-level match instead of ~30 reads and calls)."""
    loc, numel_raw, pid_at, offset_raw, size_raw, size_at, stride_raw, stride_at, grad, od, *writes = found.groups()
    loc_i, od_i = loc[0], od[0]
    u32 = _U32.unpack
    pid_i, size_i, stride_i = u32(pid_at)[0], u32(size_at)[0], u32(stride_at)[0]
    if loc_i in taken or od_i in taken or od_i in (pid_i, size_i, stride_i):
        raise _Reject
    memo = m.memo
    location = memo[loc_i]
    if memo[od_i] is not _ORDERED_DICT:
        raise _Reject
    offset = offset_raw[1] if len(offset_raw) == 2 else _quick_int(offset_raw, 0)[0]  # BININT1: most offsets
    q = found.end()
    if offset < 0 or m.data[q] in _PUT_OPS:  # a second write of the tensor: `_scan_record` reads those
        raise _Reject
    known = m._dims
    size_n = known.get(size_raw) or _quick_dims(size_raw, 0, m.limits.max_dims, known)[::2]
    stride_n = known.get(stride_raw) or _quick_dims(stride_raw, 0, m.limits.max_dims, known)[::2]
    size, n_size = size_n
    stride, n_stride = stride_n
    if len(size) != len(stride) or max(n_size, n_stride) > m.limits.max_stack:
        raise _Reject
    pid = (tag, stype, key, location, numel_raw[1] if len(numel_raw) == 2 else _quick_int(numel_raw, 0)[0])
    hooks_i, args_i, tensor_i = u32(writes[0])[0], u32(writes[1])[0], u32(writes[2])[0]
    puts += ((pid_i, pid), (size_i, size), (stride_i, stride), (hooks_i, _P_HOOKS), (args_i, _P_ARGS),
             (tensor_i, _P_TENSOR))
    # BINPERSID follows the persistent id's write; the last REDUCE precedes the tensor's write
    return (q, pid, found.end(3), offset, size, stride, grad == b"\x88", found.start(13) - 2,
            n_size + n_stride + 14)


def _quick_tail(m: Unpickler, s: int, tag: Any, stype: Any, key: str, puts: list[tuple[int, Any]],
                taken: list[int]) -> _Plan:
    """Parse the tail at `s` (after the key and its memo write); kept in `m._tails` if it writes nothing."""
    data, memo = m.data, m.memo
    n = len(puts)
    loc_i, q = _quick_index(data, s, 0x68, 0x6A)
    if loc_i in taken:
        raise _Reject
    location = memo[loc_i]
    if data[q] in _PUTS:
        q = _quick_put(data, q, location, puts, taken)
    numel, q = _quick_int(data, q)
    if data[q] in _PUTS:
        q = _quick_put(data, q, numel, puts, taken)
    if data[q] != 0x74:  # TUPLE: the persistent id
        raise _Reject
    pid = (tag, stype, key, location, numel)
    q += 1
    if data[q] in _PUTS:
        q = _quick_put(data, q, pid, puts, taken)
    if data[q] != 0x51:  # BINPERSID
        raise _Reject
    persid_pos = q
    q += 1
    if data[q] in _PUTS:
        q = _quick_put(data, q, _P_STORAGE, puts, taken)
    offset, q = _quick_int(data, q)
    if offset < 0:
        raise _Reject
    if data[q] in _PUTS:
        q = _quick_put(data, q, offset, puts, taken)
    known, max_dims = m._dims, m.limits.max_dims
    size, q, n_size = _quick_dims(data, q, max_dims, known)
    if data[q] in _PUTS:
        q = _quick_put(data, q, size, puts, taken)
    stride, q, n_stride = _quick_dims(data, q, max_dims, known)
    if data[q] in _PUTS:
        q = _quick_put(data, q, stride, puts, taken)
    if len(size) != len(stride) or max(n_size, n_stride) > m.limits.max_stack:
        raise _Reject
    c = data[q]
    if c != 0x88 and c != 0x89:  # NEWTRUE / NEWFALSE
        raise _Reject
    requires_grad = c == 0x88
    q += 1
    if data[q] in _PUTS:
        q = _quick_put(data, q, requires_grad, puts, taken)
    od_i, q = _quick_index(data, q, 0x68, 0x6A)
    if od_i in taken or memo[od_i] is not _ORDERED_DICT:
        raise _Reject
    if data[q] in _PUTS:
        q = _quick_put(data, q, _ORDERED_DICT, puts, taken)
    if data[q] != 0x29 or data[q + 1] != 0x52:  # EMPTY_TUPLE REDUCE: OrderedDict()
        raise _Reject
    q += 2
    if data[q] in _PUTS:
        q = _quick_put(data, q, _P_HOOKS, puts, taken)
    if data[q] != 0x74:  # TUPLE: the 6 arguments
        raise _Reject
    q += 1
    if data[q] in _PUTS:
        q = _quick_put(data, q, _P_ARGS, puts, taken)
    if data[q] != 0x52:  # REDUCE
        raise _Reject
    reduce_pos = q
    q += 1
    if data[q] in _PUTS:
        q = _quick_put(data, q, _P_TENSOR, puts, taken)
    if q > m.end or data[q] in _PUT_OPS:  # a second write of the tensor: `_scan_record` reads those
        raise _Reject
    pushes = n_size + n_stride + 14  # 5 fields + their tuple, and what `_scan_record` counts besides
    if len(puts) == n and q - s <= _TAIL_WINDOW and len(m._tails) < _QUICK_CACHE:
        m._tails[bytes(data[s:q])] = (loc_i, numel, persid_pos - s, offset, size, stride, requires_grad, od_i,
                                      reduce_pos - s, pushes)
    return (q, pid, persid_pos, offset, size, stride, requires_grad, reduce_pos, pushes)


def _quick_put(data: Any, q: int, value: Any, puts: list[tuple[int, Any]], taken: list[int]) -> int:
    """The BINPUT / LONG_BINPUT of `value` at `q` (callers check `_PUTS` first)."""
    if data[q] == 0x71:
        i, q = data[q + 1], q + 2
    else:
        i, q = _U32.unpack_from(data, q + 1)[0], q + 5
    puts.append((i, value))
    taken.append(i)
    return q


def _quick_int(data: Any, q: int) -> tuple[int, int]:
    c = data[q]
    if c == 0x4B:
        return data[q + 1], q + 2
    if c == 0x4D:
        return _U16.unpack_from(data, q + 1)[0], q + 3
    if c == 0x4A:
        return _I32.unpack_from(data, q + 1)[0], q + 5
    raise _Reject


def _quick_get(data: Any, q: int, memo: dict[int, Any], taken: list[int]) -> tuple[Any, int]:
    i, q = _quick_index(data, q, 0x68, 0x6A)
    if i in taken:
        raise _Reject
    return memo[i], q  # KeyError: read before written, the general loop's error


def _quick_index(data: Any, q: int, short: int, long: int) -> tuple[int, int]:
    c = data[q]
    if c == short:
        return data[q + 1], q + 2
    if c == long:
        return _U32.unpack_from(data, q + 1)[0], q + 5
    raise _Reject


def _quick_dims(data: Any, q: int, max_dims: int, known: dict[bytes, tuple[tuple[int, ...], int]]
                ) -> tuple[tuple[int, ...], int, int]:
    """A size or stride: (dims, next position, values pushed); equal dims share one tuple (`known`)."""
    c = data[q]
    if c == 0x29:  # EMPTY_TUPLE
        return (), q + 1, 1
    if c == 0x28:  # MARK ints TUPLE
        r = q + 1
        n = 0
        while data[r] != 0x74:
            _, r = _quick_int(data, r)
            n += 1
            if n > max_dims:
                raise _Reject
        r += 1
    else:  # 1 to 3 ints, then TUPLE1/2/3
        r, n = q, 0
        while n < 3 and data[r] in _QUICK_INTS:
            _, r = _quick_int(data, r)
            n += 1
        if n == 0 or data[r] != 0x84 + n:
            raise _Reject
        r += 1
    raw = bytes(data[q:r])  # a memoryview slice would not hash
    hit = known.get(raw)
    if hit is not None:
        return hit[0], r, hit[1]
    vals = []
    s = q + 1 if c == 0x28 else q
    for _ in range(n):
        v, s = _quick_int(data, s)
        vals.append(v)
    dims = tuple(vals)
    if not _valid_dims(dims, max_dims):
        raise _Reject
    if len(known) < _QUICK_CACHE:
        known[raw] = (dims, n + 1)
    return dims, r, n + 1

_SCAN_ERRORS = (_Reject, IndexError, struct.error, UnicodeDecodeError)
_QUICK_ERRORS = (*_SCAN_ERRORS, KeyError)  # KeyError: a memo read before its write


def _fast_rebuild_v2(m: Unpickler, p: int) -> int:
    """Interpret the `_rebuild_tensor_v2` record whose args MARK is at `p`, then any records that follow
    it as `name, callee, record` pairs of a state_dict; returns where the general loop resumes, or -1
    when it must interpret the record at `p` itself."""
    lim = m.limits
    if (m.persistent_load is None or len(m.metastack) + 3 > lim.max_marks or len(m.stack) + 1 > lim.max_stack
            or lim.max_stack < 8):
        return -1
    puts: list[tuple[int, Any]] = []
    try:
        plan = _quick_record(m, p, puts, [])
    except _QUICK_ERRORS:
        puts = []
        try:
            plan = _scan_record(m, p, puts)
        except _SCAN_ERRORS:
            return -1
    if not _room(m, plan[-1], puts):
        return -1
    _commit(m, plan, puts)
    q = plan[0]
    data, end, stack = m.data, m.end, m.stack
    max_stack, max_objects = lim.max_stack, lim.max_objects
    while True:  # the next pair: name [put] callee ( record
        if q + 8 > end or data[q] not in _NAME_OPS or len(stack) + 3 > max_stack:
            return q
        try:
            name, callee, plan, puts = _quick_pair(m, q)
        except _QUICK_ERRORS:
            try:
                name, callee, plan, puts = _scan_pair(m, q)
            except _SCAN_ERRORS:
                return q
        if m.objects + plan[-1] + 2 > max_objects or (puts and not _room(m, plan[-1] + 2, puts)):
            return q
        # the general loop's pushes of the name and the callee (its memo writes come with the record's)
        m.objects += 2
        stack.append(name)
        stack.append(callee)
        _commit(m, plan, puts)
        q = plan[0]


def _scan_pair(m: Unpickler, q: int) -> tuple[str, Any, _Plan, list[tuple[int, Any]]]:
    """`_quick_pair` for every pair `_scan_record` reads (the name at `q` a string), or _Reject."""
    data, memo = m.data, m.memo
    puts: list[tuple[int, Any]] = []
    name, r = _scan_item(data, q, m.end, memo, puts)
    if data[r] in _PUT_OPS:
        r = _scan_put(data, r, puts, name)
    c = data[r]
    if c != 0x68 and c != 0x6A:
        raise _Reject
    callee, r = _scan_get(data, r, memo, puts)
    if callee is not _REBUILD_V2 or data[r] != 0x28:
        raise _Reject
    return name, callee, _scan_record(m, r, puts), puts


# --------------------------------------------------------------------------------------------
# The allow-list


_MODULE_ALIASES = {
    "__builtin__": "builtins",
    "copy_reg": "copyreg",
    "numpy._core.multiarray": "numpy.core.multiarray",
    "numpy.core.numeric": "numpy.core.multiarray",
    "numpy._core.numeric": "numpy.core.multiarray",
}

_DANGEROUS_MODULES = frozenset({
    "os", "posix", "nt", "sys", "subprocess", "builtins", "shutil", "socket", "importlib", "runpy",
    "pty", "ctypes", "pickle", "_pickle", "marshal", "code", "codecs", "_codecs", "io", "_io",
    "multiprocessing", "threading", "signal", "webbrowser", "urllib", "http", "tempfile", "types",
    "functools", "operator", "copyreg", "inspect", "pdb", "timeit", "platform", "asyncio", "glob",
    "zipimport", "pkgutil", "site", "sysconfig", "distutils", "setuptools", "pip",
    "commands", "popen2", "cPickle",  # Python 2 names (pickle maps subprocess to commands below protocol 3)
})

_COPYREG_CONSTRUCTORS = frozenset({"copyreg._reconstructor", "copyreg.__newobj__", "copyreg.__newobj_ex__"})

_TENSOR_WRAPPERS = frozenset({"torch.nn.parameter.Parameter", "torch.autograd.variable.Variable",
                              "torch.nn.parameter.Buffer"})


def _as_tensor(m: Unpickler, value: Any, what: str) -> TensorRef | UnsupportedTensor:
    if isinstance(value, (TensorRef, UnsupportedTensor)):
        return value
    raise m.error(f"{what} expects a tensor, got {_tname(value)}")


def _int_arg(m: Unpickler, v: Any, what: str, *, lo: int = 0) -> int:
    if type(v) is not int or v < lo:
        raise m.error(f"{what} must be an integer >= {lo}, got {_tname(v)}")
    if v >= _INT64_LIMIT:  # torch keeps sizes, strides and offsets in int64
        raise m.error(f"{what} does not fit in 64 bits")
    return v


_INT64_LIMIT = 1 << 63


def _shape_arg(m: Unpickler, v: Any, what: str, *, lo: int = 0) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)):
        raise m.error(f"{what} must be a tuple of integers, got {_tname(v)}")
    if len(v) > m.limits.max_dims:
        raise m.limit(f"{what} has {len(v)} dimensions (limit {m.limits.max_dims})")
    return tuple(_int_arg(m, d, what, lo=lo) for d in v)


def _tensor(m: Unpickler, fn: str, storage: Any, offset: Any, size: Any, stride: Any,
            dtype: Any = None) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise m.error(f"{fn}: the storage argument must come from a storage persistent id, "
                      f"got {_tname(storage)}")
    shape = _shape_arg(m, size, f"{fn} size")
    strides = _shape_arg(m, stride, f"{fn} stride")
    if len(strides) != len(shape):
        raise m.error(f"{fn}: {len(shape)} sizes but {len(strides)} strides")
    dname = None
    if dtype is not None:
        if not isinstance(dtype, TorchDtype):
            raise m.error(f"{fn}: dtype must be a torch dtype, got {_tname(dtype)}")
        dname = dtype.name
    return TensorRef(storage, _int_arg(m, offset, f"{fn} storage_offset"), shape, strides, dname)


def _h_rebuild_tensor(m: Unpickler, a: tuple, kw: dict) -> TensorRef:  # type: ignore[type-arg]
    if len(a) != 4 or kw:
        raise m.error("_rebuild_tensor expects (storage, offset, size, stride)")
    return _tensor(m, "_rebuild_tensor", *a)


def _h_rebuild_tensor_v2(m: Unpickler, a: tuple, kw: dict) -> TensorRef:  # type: ignore[type-arg]
    if not 6 <= len(a) <= 7 or kw:
        raise m.error("_rebuild_tensor_v2 expects 6 or 7 arguments")
    t = _tensor(m, "_rebuild_tensor_v2", *a[:4])
    t.requires_grad = a[4] is True
    return t


def _h_rebuild_tensor_v3(m: Unpickler, a: tuple, kw: dict) -> TensorRef:  # type: ignore[type-arg]
    if not 7 <= len(a) <= 8 or kw:
        raise m.error("_rebuild_tensor_v3 expects 7 or 8 arguments")
    t = _tensor(m, "_rebuild_tensor_v3", *a[:4], dtype=a[6])
    t.requires_grad = a[4] is True
    return t


def _h_rebuild_parameter(m: Unpickler, a: tuple, kw: dict) -> Any:  # type: ignore[type-arg]
    if not 1 <= len(a) <= 4 or kw:
        raise m.error("_rebuild_parameter expects (data, requires_grad, hooks[, state])")
    t = _as_tensor(m, a[0], "_rebuild_parameter")
    if isinstance(t, TensorRef) and len(a) > 1:
        t.requires_grad = a[1] is True
    return t


def _h_rebuild_from_type(m: Unpickler, a: tuple, kw: dict) -> Any:  # type: ignore[type-arg]
    if len(a) != 4 or kw:
        raise m.error("_rebuild_from_type(_v2) expects (func, type, args, state)")
    func, new_type, args, _state = a
    if not isinstance(new_type, (TorchType, Opaque)):
        raise m.error(f"_rebuild_from_type: the type must be a class, got {_tname(new_type)}")
    if m._depth >= m.limits.max_key_depth:  # each level is Python frames: bounded before recursion is
        raise m.limit(f"_rebuild_from_type calls nested deeper than {m.limits.max_key_depth}")
    m._depth += 1
    try:
        result = m.call(func, args, None, "_rebuild_from_type")
    finally:
        m._depth -= 1
    return _as_tensor(m, result, "_rebuild_from_type")


def _unsupported(kind: str) -> Handler:
    def handler(m: Unpickler, a: tuple, kw: dict) -> UnsupportedTensor:  # type: ignore[type-arg]
        dtype = None
        if a and isinstance(a[0], StorageRef):
            dtype = a[0].dtype
        return UnsupportedTensor(kind, dtype)

    return handler


def _h_ordered_dict(m: Unpickler, a: tuple, kw: dict) -> ODict:  # type: ignore[type-arg]
    d = ODict()
    if kw or len(a) > 1:
        raise m.error("OrderedDict expects at most one argument")
    if a:
        _fill_pairs(m, d, a[0], "OrderedDict")
    return d


def _h_defaultdict(m: Unpickler, a: tuple, kw: dict) -> ODict:  # type: ignore[type-arg]
    if kw or len(a) > 2:
        raise m.error("defaultdict expects (factory[, items])")
    d = ODict()  # the factory is never called: only stored items matter
    if len(a) == 2:
        _fill_pairs(m, d, a[1], "defaultdict")
    return d


def _fill_pairs(m: Unpickler, d: dict, src: Any, what: str) -> None:  # type: ignore[type-arg]
    if isinstance(src, dict):
        for k, v in src.items():
            d[k] = v
        return
    if not isinstance(src, (list, tuple)):
        raise m.error(f"{what} expects a list of pairs, got {_tname(src)}")
    counts = m.hash_counts(d)
    for pair in src:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise m.error(f"{what} expects (key, value) pairs")
        d[m.key(pair[0], counts, d)] = pair[1]


def _sequence_arg(m: Unpickler, a: tuple, kw: dict, what: str) -> list[Any]:  # type: ignore[type-arg]
    if kw or len(a) > 1:
        raise m.error(f"{what} expects at most one argument")
    if not a:
        return []
    src = a[0]
    if isinstance(src, (list, tuple, set, frozenset)):
        return list(src)
    if isinstance(src, dict):
        return list(src.keys())
    raise m.error(f"{what} of a {_tname(src)} is not supported")


def _h_set(m: Unpickler, a: tuple, kw: dict) -> set:  # type: ignore[type-arg]
    m.charge(_SET_SIZE)
    counts: dict[int, int] = {}
    members: set[Any] = set()
    for x in _sequence_arg(m, a, kw, "set"):
        members.add(m.key(x, counts, members))
    return members


def _h_frozenset(m: Unpickler, a: tuple, kw: dict) -> frozenset:  # type: ignore[type-arg]
    return _make_frozenset(m, _sequence_arg(m, a, kw, "frozenset"))


def _h_list(m: Unpickler, a: tuple, kw: dict) -> list:  # type: ignore[type-arg]
    return _sequence_arg(m, a, kw, "list")


def _h_tuple(m: Unpickler, a: tuple, kw: dict) -> tuple:  # type: ignore[type-arg]
    return tuple(_sequence_arg(m, a, kw, "tuple"))


def _h_dict(m: Unpickler, a: tuple, kw: dict) -> dict:  # type: ignore[type-arg]
    d: dict[Any, Any] = {}
    if len(a) > 1:
        raise m.error("dict expects at most one argument")
    if a:
        _fill_pairs(m, d, a[0], "dict")
    for k, v in kw.items():
        d[k] = v
    return d


_TEXT_ENCODINGS = {"latin1": "latin-1", "latin-1": "latin-1", "utf-8": "utf-8", "utf8": "utf-8",
                   "ascii": "ascii"}


def _bytes_from(m: Unpickler, a: tuple, kw: dict, what: str) -> bytes:  # type: ignore[type-arg]
    if kw:
        raise m.error(f"{what} takes no keyword arguments here")
    if not a:
        return b""
    if len(a) == 1 and isinstance(a[0], (bytes, bytearray)):
        return bytes(a[0])
    if len(a) == 2 and isinstance(a[0], str) and isinstance(a[1], str) and a[1].lower() in _TEXT_ENCODINGS:
        try:
            return a[0].encode(_TEXT_ENCODINGS[a[1].lower()])
        except UnicodeEncodeError:
            raise m.error(f"{what}: text does not fit encoding {a[1]}") from None
    raise m.error(f"{what} accepts only bytes or (text, encoding) here")  # never bytes(n): no allocation bombs


def _h_codecs_encode(m: Unpickler, a: tuple, kw: dict) -> bytes:  # type: ignore[type-arg]
    if len(a) == 1 and isinstance(a[0], str):
        a = (a[0], "utf-8")
    return _bytes_from(m, a, kw, "_codecs.encode")


def _h_bytes(m: Unpickler, a: tuple, kw: dict) -> bytes:  # type: ignore[type-arg]
    return _bytes_from(m, a, kw, "bytes")


def _h_bytearray(m: Unpickler, a: tuple, kw: dict) -> bytearray:  # type: ignore[type-arg]
    return bytearray(_bytes_from(m, a, kw, "bytearray"))


def _h_complex(m: Unpickler, a: tuple, kw: dict) -> complex:  # type: ignore[type-arg]
    if kw or not 1 <= len(a) <= 2 or not all(type(x) in (int, float) for x in a):
        raise m.error("complex expects one or two numbers")
    if any(type(x) is int and not -_FLOAT_INT_LIMIT < x < _FLOAT_INT_LIMIT for x in a):
        raise m.error("complex: an integer argument does not fit in a float")
    return complex(*a)


_FLOAT_INT_LIMIT = 1 << 1023  # integers below this convert to a finite float


def _h_slice(m: Unpickler, a: tuple, kw: dict) -> slice:  # type: ignore[type-arg]
    if kw or not 1 <= len(a) <= 3 or not all(x is None or type(x) is int for x in a):
        raise m.error("slice expects up to three integers or None")
    return slice(*a)


def _h_size(m: Unpickler, a: tuple, kw: dict) -> tuple[int, ...]:  # type: ignore[type-arg]
    if kw or len(a) > 1:
        raise m.error("torch.Size expects one sequence")
    return _shape_arg(m, a[0] if a else (), "torch.Size")


def _h_device(m: Unpickler, a: tuple, kw: dict) -> Device:  # type: ignore[type-arg]
    if (kw or not 1 <= len(a) <= 2 or not isinstance(a[0], str) or len(a[0]) > 64
            or (len(a) == 2 and (type(a[1]) is not int or not -1 <= a[1] < 1 << 16))):
        raise m.error("torch.device expects (type[, index]) with a short type name and a small index")
    return Device(a[0] if len(a) == 1 else f"{a[0]}:{a[1]}")


_NUMPY_CODES = frozenset({"b1", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8"})


def _h_numpy_dtype(m: Unpickler, a: tuple, kw: dict) -> NumpyDtype:  # type: ignore[type-arg]
    if kw or not 1 <= len(a) <= 3 or not isinstance(a[0], str) or len(a[0]) > 64:
        raise m.error("numpy.dtype expects (code, align, copy)")
    return NumpyDtype(a[0], known=a[0] in _NUMPY_CODES)


def _h_numpy_scalar(m: Unpickler, a: tuple, kw: dict) -> Any:  # type: ignore[type-arg]
    """numpy.core.multiarray.scalar(dtype, raw): decoded from the raw bytes, numpy's pickle code unused."""
    if kw or len(a) != 2 or not isinstance(a[0], NumpyDtype):
        raise m.error("numpy scalar expects (dtype, bytes)")
    dt, raw = a
    if not dt.known or not isinstance(raw, (bytes, bytearray)):
        return Opaque(f"numpy scalar of dtype {dt.code}")
    order = "<" if dt.byteorder in ("|", "=") else dt.byteorder
    npdt = np.dtype(order + dt.code)
    if len(raw) != npdt.itemsize:
        raise m.error(f"numpy scalar of dtype {dt.code} with {len(raw)} bytes")
    return np.frombuffer(raw, dtype=npdt)[0].item()


def _h_numpy_reconstruct(m: Unpickler, a: tuple, kw: dict) -> NumpyArray:  # type: ignore[type-arg]
    if kw or len(a) != 3 or not isinstance(a[0], TorchType) or a[0].name != "numpy.ndarray":
        raise m.error("numpy _reconstruct expects (numpy.ndarray, shape, typecode)")
    return NumpyArray()


def _h_numpy_frombuffer(m: Unpickler, a: tuple, kw: dict) -> NumpyArray:  # type: ignore[type-arg]
    """numpy's protocol-5 reduction (buffer, dtype, shape, order): recorded, never rebuilt."""
    if kw or len(a) != 4 or not isinstance(a[2], tuple):
        raise m.error("numpy _frombuffer expects (buffer, dtype, shape, order)")
    dtype = a[1] if isinstance(a[1], NumpyDtype) else None
    return NumpyArray(_shape_arg(m, a[2], "numpy array shape"), dtype)


def _builtin(name: str, fn: Handler | None) -> Builtin:
    return Builtin(name, fn)


def _make_table() -> dict[tuple[str, str], Any]:
    t: dict[tuple[str, str], Any] = {}
    u = "torch._utils"
    for fname, fn in (("_rebuild_tensor", _h_rebuild_tensor), ("_rebuild_tensor_v2", _h_rebuild_tensor_v2),
                      ("_rebuild_tensor_v3", _h_rebuild_tensor_v3),
                      ("_rebuild_parameter", _h_rebuild_parameter),
                      ("_rebuild_parameter_with_state", _h_rebuild_parameter)):
        t[(u, fname)] = _builtin(f"{u}.{fname}", fn)
    for kind, fname in (("quantized", "_rebuild_qtensor"), ("sparse", "_rebuild_sparse_tensor"),
                        ("sparse CSR", "_rebuild_sparse_csr_tensor"), ("nested", "_rebuild_nested_tensor"),
                        ("meta (no data)", "_rebuild_meta_tensor_no_storage"),
                        ("wrapper subclass", "_rebuild_wrapper_subclass"),
                        ("numpy-backed device", "_rebuild_device_tensor_from_numpy"),
                        ("device", "_rebuild_device_tensor_from_cpu_tensor"),
                        ("XLA", "_rebuild_xla_tensor"), ("MKL-DNN", "_rebuild_mkldnn_tensor")):
        t[(u, fname)] = _builtin(f"{u}.{fname}", _unsupported(kind))
    for mod in ("torch._tensor", "torch.tensor"):
        t[(mod, "_rebuild_from_type_v2")] = _builtin(f"{mod}._rebuild_from_type_v2", _h_rebuild_from_type)
        t[(mod, "_rebuild_from_type")] = _builtin(f"{mod}._rebuild_from_type", _h_rebuild_from_type)
    for mod in ("torch", "torch.cuda", "torch.storage"):
        for sname, dt in _STORAGE_DTYPES.items():
            t[(mod, sname)] = StorageType(sname, dt)
    for dname in ELEMENT_SIZES:
        t[("torch", dname)] = TorchDtype(dname)
    for alias, dname in _DTYPE_ALIASES.items():
        t[("torch", alias)] = TorchDtype(dname)
    t[("torch", "Size")] = _builtin("torch.Size", _h_size)
    t[("torch", "device")] = _builtin("torch.device", _h_device)
    for name in ("torch.Tensor", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer",
                 "torch.autograd.variable.Variable", "numpy.ndarray"):
        mod, _, short = name.rpartition(".")
        t[(mod, short)] = TorchType(name)
    t[("torch.nn", "Parameter")] = TorchType("torch.nn.parameter.Parameter")
    for prefix in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool"):
        for mod in ("torch", "torch.cuda"):  # legacy tar files name the tensor class
            t[(mod, f"{prefix}Tensor")] = TorchType(f"{mod}.{prefix}Tensor")
    t[("collections", "OrderedDict")] = _builtin("collections.OrderedDict", _h_ordered_dict)
    t[("collections", "defaultdict")] = _builtin("collections.defaultdict", _h_defaultdict)
    t[("builtins", "set")] = _builtin("builtins.set", _h_set)
    t[("builtins", "frozenset")] = _builtin("builtins.frozenset", _h_frozenset)
    t[("builtins", "list")] = _builtin("builtins.list", _h_list)
    t[("builtins", "tuple")] = _builtin("builtins.tuple", _h_tuple)
    t[("builtins", "dict")] = _builtin("builtins.dict", _h_dict)
    t[("builtins", "bytes")] = _builtin("builtins.bytes", _h_bytes)
    t[("builtins", "bytearray")] = _builtin("builtins.bytearray", _h_bytearray)
    t[("builtins", "complex")] = _builtin("builtins.complex", _h_complex)
    t[("builtins", "slice")] = _builtin("builtins.slice", _h_slice)
    t[("_codecs", "encode")] = _builtin("_codecs.encode", _h_codecs_encode)
    t[("numpy", "dtype")] = _builtin("numpy.dtype", _h_numpy_dtype)
    t[("numpy.core.multiarray", "scalar")] = _builtin("numpy.core.multiarray.scalar", _h_numpy_scalar)
    t[("numpy.core.multiarray", "_frombuffer")] = _builtin("numpy.core.numeric._frombuffer", _h_numpy_frombuffer)
    t[("numpy.core.multiarray", "_reconstruct")] = _builtin("numpy.core.multiarray._reconstruct",
                                                            _h_numpy_reconstruct)
    return t


_TABLE = _make_table()
_REBUILD_V2 = _TABLE[("torch._utils", "_rebuild_tensor_v2")]
_ORDERED_DICT = _TABLE[("collections", "OrderedDict")]


def _resolve(module: str, name: str) -> Any:
    return _TABLE.get((module, name))


def load(
    data: bytes | bytearray | memoryview,
    *,
    label: str | None = None,
    persistent_load: Callable[[Any], Any] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Any:
    """Interpret one whole pickle held in memory."""
    return Unpickler(data, label=label, persistent_load=persistent_load, limits=limits).load()

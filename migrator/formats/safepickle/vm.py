"""The interpreter's state and the checks every opcode shares: input, stack, memo, limits, calls.

`Unpickler.load` dispatches each opcode to its handler in `opcodes.py`; calls of globals go through
`Unpickler.call`, which applies an allow-listed handler (`allowlist.py`), builds an inert
`Placeholder`, or refuses.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from ...core.errors import FormatError, LimitExceededError, UnsafePickleError
from ...core.limits import DEFAULT_LIMITS, Limits
from .allowlist import _COPYREG_CONSTRUCTORS, _MODULE_ALIASES, _TENSOR_WRAPPERS, _as_tensor, _is_gadget, _resolve
from .records import _fast_rebuild_v2
from .values import (
    _PLACEHOLDER_SIZE,
    Builtin,
    Opaque,
    Placeholder,
    StorageType,
    TorchDtype,
    TorchType,
    _tname,
)


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
        fast: bool = True,
    ) -> None:
        self.data = data if isinstance(data, bytes) else memoryview(data).cast("B")
        self.fast = fast  # offer tensor records to the record scanner (False: the opcode loop only)
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
        self.objects = 0
        self.placeholders = 0  # Placeholder objects made (the reader walks for their key paths if any)
        self.spent = 0  # bytes of the containers made so far (see `charge`)
        self.budget = limits.max_object_bytes * max(self.end - start, 0) + limits.pickle_object_base
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

    def scan_record(self, p: int) -> int:
        """The record scanner (`records.py`) on the tensor record whose MARK is at `p` (see there)."""
        return _fast_rebuild_v2(self, p)

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
                self._op_pos = p  # where the input ended (not the last opcode's start: the scanner reads many)
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


from .opcodes import _OPS  # noqa: E402  (the handlers take an Unpickler: imported after it)

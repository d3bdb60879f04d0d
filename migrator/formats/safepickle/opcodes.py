"""The opcode handlers (protocols 0-5): each reads its operands, checks them, and updates the stack.

`_OPS` maps an opcode byte to its handler; a None entry is an unknown opcode. Tensor records
(`_rebuild_tensor_v2(...)` after a MARK) are offered to the record scanner (`records.py`) first.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .allowlist import _REBUILD_V2, _make_frozenset, _shape_arg
from .values import (
    _MEMO_ENTRY,
    _SET_SIZE,
    Builtin,
    NumpyArray,
    NumpyDtype,
    ODict,
    Opaque,
    Placeholder,
    Record,
    StorageType,
    TensorRef,
    TorchDtype,
    TorchType,
    UnsupportedTensor,
    _tname,
    describe,
)

if TYPE_CHECKING:
    from .machine import Machine

_U32 = struct.Struct("<I")


def _op(code: bytes) -> Callable[[Callable[[Machine], None]], Callable[[Machine], None]]:
    def deco(fn: Callable[[Machine], None]) -> Callable[[Machine], None]:
        _DISPATCH[code[0]] = fn
        return fn

    return deco


_DISPATCH: dict[int, Callable[[Machine], None]] = {}


@_op(b"\x80")
def _proto(m: Machine) -> None:
    v = m.read(1, "PROTO")[0]
    if v > 5:
        raise m.error(f"unsupported pickle protocol {v} (0-5 are known)")
    if m.protocol is None:
        m.protocol = v


@_op(b"\x95")
def _frame(m: Machine) -> None:
    n = m._u("<Q", 8, "FRAME")
    if n > m.end - m.pos:
        raise m.error(f"FRAME declares {n} bytes but only {m.end - m.pos} remain (truncated?)")


@_op(b".")
def _stop(m: Machine) -> None:
    m._result = m.pop()
    m._done = True


@_op(b"(")
def _mark(m: Machine) -> None:
    stack = m.stack
    if stack and stack[-1] is _REBUILD_V2 and m.fast:
        q = m.scan_record(m.pos - 1)
        if q >= 0:
            m.pos = q
            return
    if len(m.metastack) >= m.limits.max_marks:
        raise m.limit(f"more than {m.limits.max_marks} nested MARKs")
    m.metastack.append(m.stack)
    m.stack = []


@_op(b"0")
def _pop(m: Machine) -> None:
    if m.stack:
        m.stack.pop()
    else:
        m.pop_mark()


@_op(b"1")
def _pop_mark(m: Machine) -> None:
    m.pop_mark()


@_op(b"2")
def _dup(m: Machine) -> None:
    m.push(m.top())


# -- constants and numbers


@_op(b"N")
def _none(m: Machine) -> None:
    m.push(None)


@_op(b"\x88")
def _true(m: Machine) -> None:
    m.push(True)


@_op(b"\x89")
def _false(m: Machine) -> None:
    m.push(False)


def _parse_int(m: Machine, text: bytes, what: str) -> int:
    if len(text) > m.limits.max_long_bytes:
        raise m.limit(f"{what} has {len(text)} digits (limit {m.limits.max_long_bytes})")
    try:
        return int(text.decode("ascii"), 0)
    except (UnicodeDecodeError, ValueError):
        raise m.error(f"{what}: invalid integer literal") from None


@_op(b"I")
def _int(m: Machine) -> None:
    text = m.readline("INT")
    if text == b"00":
        m.push(False)
    elif text == b"01":
        m.push(True)
    else:
        m.push(_parse_int(m, text, "INT"))


@_op(b"L")
def _long(m: Machine) -> None:
    text = m.readline("LONG")
    if text.endswith(b"L"):
        text = text[:-1]
    m.push(_parse_int(m, text, "LONG"))


@_op(b"J")
def _binint(m: Machine) -> None:
    m.push(m._u("<i", 4, "BININT"))


@_op(b"K")
def _binint1(m: Machine) -> None:
    p = m.pos
    if p < m.end:
        m.pos = p + 1
        m.push(m.data[p])
    else:
        m.push(m.read(1, "BININT1")[0])


@_op(b"M")
def _binint2(m: Machine) -> None:
    m.push(m._u("<H", 2, "BININT2"))


@_op(b"\x8a")
def _long1(m: Machine) -> None:
    n = m.read(1, "LONG1")[0]
    m.push(int.from_bytes(m.read(n, "LONG1"), "little", signed=True))


@_op(b"\x8b")
def _long4(m: Machine) -> None:
    n = m._u("<i", 4, "LONG4")
    if n < 0:
        raise m.error("LONG4 with a negative length")
    if n > m.limits.max_long_bytes:
        raise m.limit(f"LONG4 of {n} bytes (limit {m.limits.max_long_bytes})")
    m.push(int.from_bytes(m.read(n, "LONG4"), "little", signed=True))


@_op(b"F")
def _float(m: Machine) -> None:
    text = m.readline("FLOAT")
    if len(text) > 1024:
        raise m.limit("FLOAT literal longer than 1024 characters")
    try:
        m.push(float(text.decode("ascii")))
    except (UnicodeDecodeError, ValueError):
        raise m.error("FLOAT: invalid literal") from None


@_op(b"G")
def _binfloat(m: Machine) -> None:
    m.push(struct.unpack(">d", m.read(8, "BINFLOAT"))[0])


# -- strings and bytes


def _decode(m: Machine, raw: bytes, what: str, encoding: str = "utf-8", errors: str = "strict") -> str:
    try:
        return raw.decode(encoding, errors)
    except UnicodeDecodeError:
        raise m.error(f"{what}: invalid {encoding} text") from None


@_op(b"S")
def _string(m: Machine) -> None:
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
def _binstring(m: Machine) -> None:
    n = m._u("<i", 4, "BINSTRING")
    m.push(_decode(m, m.read(n, "BINSTRING"), "BINSTRING"))


@_op(b"U")
def _short_binstring(m: Machine) -> None:
    n = m.read(1, "SHORT_BINSTRING")[0]
    m.push(_decode(m, m.read(n, "SHORT_BINSTRING"), "SHORT_BINSTRING"))


@_op(b"V")
def _unicode(m: Machine) -> None:
    m.push(_decode(m, m.readline("UNICODE"), "UNICODE", "raw-unicode-escape"))


@_op(b"X")
def _binunicode(m: Machine) -> None:
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
def _short_binunicode(m: Machine) -> None:
    n = m.read(1, "SHORT_BINUNICODE")[0]
    m.push(_decode(m, m.read(n, "SHORT_BINUNICODE"), "SHORT_BINUNICODE", errors="surrogatepass"))


@_op(b"\x8d")
def _binunicode8(m: Machine) -> None:
    n = m._u("<Q", 8, "BINUNICODE8")
    m.push(_decode(m, m.read(n, "BINUNICODE8"), "BINUNICODE8", errors="surrogatepass"))


@_op(b"B")
def _binbytes(m: Machine) -> None:
    m.push(m.read(m._u("<I", 4, "BINBYTES"), "BINBYTES"))


@_op(b"C")
def _short_binbytes(m: Machine) -> None:
    m.push(m.read(m.read(1, "SHORT_BINBYTES")[0], "SHORT_BINBYTES"))


@_op(b"\x8e")
def _binbytes8(m: Machine) -> None:
    m.push(m.read(m._u("<Q", 8, "BINBYTES8"), "BINBYTES8"))


@_op(b"\x96")
def _bytearray8(m: Machine) -> None:
    m.push(bytearray(m.read(m._u("<Q", 8, "BYTEARRAY8"), "BYTEARRAY8")))


@_op(b"\x97")
def _next_buffer(m: Machine) -> None:
    raise m.error("NEXT_BUFFER: out-of-band buffers are not supported in checkpoint files")


@_op(b"\x98")
def _readonly_buffer(m: Machine) -> None:
    raise m.error("READONLY_BUFFER: out-of-band buffers are not supported in checkpoint files")


# -- containers


@_op(b")")
def _empty_tuple(m: Machine) -> None:
    m.push(())


@_op(b"t")
def _tuple(m: Machine) -> None:
    m.push(tuple(m.pop_mark()))


@_op(b"\x85")
def _tuple1(m: Machine) -> None:
    a = m.pop()
    m.push((a,))


@_op(b"\x86")
def _tuple2(m: Machine) -> None:
    b = m.pop()
    a = m.pop()
    m.push((a, b))


@_op(b"\x87")
def _tuple3(m: Machine) -> None:
    c = m.pop()
    b = m.pop()
    a = m.pop()
    m.push((a, b, c))


@_op(b"]")
def _empty_list(m: Machine) -> None:
    m.push([])


@_op(b"l")
def _list(m: Machine) -> None:
    m.push(m.pop_mark())


@_op(b"a")
def _append(m: Machine) -> None:
    v = m.pop()
    target = m.top()
    if not isinstance(target, list):
        if isinstance(target, Placeholder):
            return  # a list subclass's items: dropped with the object
        raise m.error(f"APPEND to a {_tname(target)}")
    target.append(v)


@_op(b"e")
def _appends(m: Machine) -> None:
    items = m.pop_mark()
    target = m.top()
    if not isinstance(target, list):
        if isinstance(target, Placeholder):
            return
        raise m.error(f"APPENDS to a {_tname(target)}")
    target.extend(items)


@_op(b"}")
def _empty_dict(m: Machine) -> None:
    m.push({})


def _set_pairs(m: Machine, target: dict, items: list[Any], what: str) -> None:
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
def _dict(m: Machine) -> None:
    d: dict[Any, Any] = {}
    _set_pairs(m, d, m.pop_mark(), "DICT")
    m.push(d)


@_op(b"s")
def _setitem(m: Machine) -> None:
    value = m.pop()
    key = m.pop()
    target = m.top()
    if not isinstance(target, dict):
        if isinstance(target, Placeholder):
            return  # a dict subclass's items (Lightning's AttributeDict): dropped with the object
        raise m.error(f"SETITEM on a {_tname(target)}")
    target[m.key(key, m.hash_counts(target), target) if type(key) is not str else key] = value


@_op(b"u")
def _setitems(m: Machine) -> None:
    items = m.pop_mark()
    target = m.top()
    if not isinstance(target, dict):
        if isinstance(target, Placeholder):
            return
        raise m.error(f"SETITEMS on a {_tname(target)}")
    _set_pairs(m, target, items, "SETITEMS")


@_op(b"\x8f")
def _empty_set(m: Machine) -> None:
    m.charge(_SET_SIZE)
    m.push(set())


@_op(b"\x90")
def _additems(m: Machine) -> None:
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
def _frozenset(m: Machine) -> None:
    m.push(_make_frozenset(m, m.pop_mark()))



# -- memo


def _memo_put(m: Machine, idx: int) -> None:
    if not 0 <= idx < 1 << 32:  # what LONG_BINPUT can write; also below 2**61-1, so no two share a hash
        raise m.error("memo index outside 0..2**32-1")
    if idx not in m.memo and len(m.memo) >= m.limits.max_memo:
        raise m.limit(f"more than {m.limits.max_memo} memo entries")
    m.memo[idx] = m.top()


def _memo_get(m: Machine, idx: int) -> None:
    try:
        value = m.memo[idx]
    except KeyError:
        raise m.error(f"memo entry {describe(idx)} read before it was written") from None
    m.push(value)


@_op(b"p")
def _put(m: Machine) -> None:
    _memo_put(m, _parse_int(m, m.readline("PUT"), "PUT"))


@_op(b"q")
def _binput(m: Machine) -> None:
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
def _long_binput(m: Machine) -> None:
    _memo_put(m, m._u("<I", 4, "LONG_BINPUT"))


@_op(b"\x94")
def _memoize(m: Machine) -> None:
    m.charge(_MEMO_ENTRY)  # one byte, one new memo entry: the only memo write that can outgrow the budget
    _memo_put(m, len(m.memo))


@_op(b"g")
def _get(m: Machine) -> None:
    _memo_get(m, _parse_int(m, m.readline("GET"), "GET"))


@_op(b"h")
def _binget(m: Machine) -> None:
    p = m.pos
    if p < m.end:
        m.pos = p + 1
        _memo_get(m, m.data[p])
    else:
        _memo_get(m, m.read(1, "BINGET")[0])


@_op(b"j")
def _long_binget(m: Machine) -> None:
    _memo_get(m, m._u("<I", 4, "LONG_BINGET"))


# -- globals, calls, objects


def _line_name(m: Machine, what: str) -> str:
    return _decode(m, m.readline(what), what)


@_op(b"c")
def _global(m: Machine) -> None:
    module = _line_name(m, "GLOBAL")
    name = _line_name(m, "GLOBAL")
    m.push(m.resolve_global(module, name))


@_op(b"\x93")
def _stack_global(m: Machine) -> None:
    name = m.pop()
    module = m.pop()
    if not isinstance(module, str) or not isinstance(name, str):
        raise m.error("STACK_GLOBAL needs two strings")
    m.push(m.resolve_global(module, name))


@_op(b"R")
def _reduce(m: Machine) -> None:
    args = m.pop()
    callee = m.pop()
    m.push(m.call(callee, args, None, "REDUCE"))


@_op(b"\x81")
def _newobj(m: Machine) -> None:
    args = m.pop()
    cls = m.pop()
    m.push(m.call(cls, args, None, "NEWOBJ"))


@_op(b"\x92")
def _newobj_ex(m: Machine) -> None:
    kwargs = m.pop()
    args = m.pop()
    cls = m.pop()
    m.push(m.call(cls, args, kwargs, "NEWOBJ_EX"))


@_op(b"i")
def _inst(m: Machine) -> None:
    module = _line_name(m, "INST")
    name = _line_name(m, "INST")
    args = tuple(m.pop_mark())
    m.push(m.call(m.resolve_global(module, name), args, None, "INST"))


@_op(b"o")
def _obj(m: Machine) -> None:
    items = m.pop_mark()
    if not items:
        raise m.error("OBJ without a class")
    m.push(m.call(items[0], tuple(items[1:]), None, "OBJ"))


@_op(b"b")
def _build(m: Machine) -> None:
    state = m.pop()
    obj = m.top()
    _apply_state(m, obj, state)


@_op(b"P")
def _persid(m: Machine) -> None:
    pid = _decode(m, m.readline("PERSID"), "PERSID", "ascii")
    m.push(_persistent(m, pid))


@_op(b"Q")
def _binpersid(m: Machine) -> None:
    m.push(_persistent(m, m.pop()))


def _persistent(m: Machine, pid: Any) -> Any:
    if m.persistent_load is None:
        raise m.error("a persistent id references tensor data, but this pickle has no data section "
                      "(a plain pickle is not a PyTorch checkpoint)")
    return m.persistent_load(pid)


for _code in (b"\x82", b"\x83", b"\x84"):

    @_op(_code)
    def _ext(m: Machine) -> None:
        raise m.unsafe("extension-registry opcodes (EXT1/EXT2/EXT4) name code by number; refused")


def _apply_state(m: Machine, obj: Any, state: Any) -> None:
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
    elif isinstance(obj, Record):
        obj.state = state  # kept as data: the format that allowed the class reads it
    elif isinstance(obj, (Builtin, TorchDtype, StorageType, TorchType)):
        raise m.unsafe(f"BUILD would modify the global {getattr(obj, 'name', '?')}; refused")
    elif state is not None:
        raise m.error(f"BUILD on a {_tname(obj)}")


_OPS: list[Callable[[Machine], None] | None] = [_DISPATCH.get(i) for i in range(256)]
"""`_DISPATCH` as a list indexed by opcode: the main loop's lookup."""

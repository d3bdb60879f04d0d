"""The record scanner: torch's tensor records read in one step instead of ~20 opcodes.

It exists for speed only (benchmarks/RESULTS.md, "Pickle record scanner"); the opcode loop stays
the reference, and `tools/fuzz.py --differential pickle` checks that both give the same result.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from .allowlist import _INT64_LIMIT, _MODULE_ALIASES, _ORDERED_DICT, _REBUILD_V2, _resolve, _tensor
from .values import ODict, StorageRef, TensorRef

if TYPE_CHECKING:
    from .machine import Machine

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
    if c == 0x8A:  # LONG1: 8 bytes at most (anything longer is no size, offset or numel)
        n = data[p + 1]
        if n > 8:
            raise _Reject
        return int.from_bytes(data[p + 2 : p + 2 + n], "little", signed=True), p + 2 + n
    raise _Reject


def _scan_put(data: Any, p: int, puts: list[tuple[int, Any]], value: Any) -> int:
    for _ in range(_MAX_PUTS + 1):
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
    raise _Reject


_MAX_PUTS = 4  # memo writes of one value the scanner reads (torch and pickle write one)


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
    if not isinstance(data, bytes):  # a memoryview has no find(): the opcode loop reads it
        raise _Reject
    i = data.find(b"\n", p + 1, end)
    j = data.find(b"\n", i + 1, end) if i >= 0 else -1
    if j < 0:
        raise _Reject
    module, name = _text(data, p + 1, i), _text(data, i + 1, j)
    value = _resolve(_MODULE_ALIASES.get(module, module), name)
    if value is None:  # not allow-listed, or too long to be (the general loop raises or records it)
        raise _Reject
    return value, j + 1


def _text(data: bytes, p: int, q: int) -> str:
    try:
        return str(data[p:q], "utf-8", "surrogatepass")
    except UnicodeDecodeError:  # the opcode loop raises its own error for it
        raise _Reject from None


def _scan_item(data: Any, p: int, end: int, memo: dict[int, Any], puts: list[tuple[int, Any]]) -> tuple[Any, int]:
    """One field of a persistent id: a string, an integer, None, a memo read or a global."""
    c = data[p]
    if c == 0x58:  # BINUNICODE
        q = p + 5 + _U32.unpack_from(data, p + 1)[0]
        if q > end:
            raise _Reject
        return _text(data, p + 5, q), q
    if c == 0x8C:  # SHORT_BINUNICODE
        q = p + 2 + data[p + 1]
        if q > end:
            raise _Reject
        return _text(data, p + 2, q), q
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
            if len(vals) > max_dims or len(vals) > 64:  # more: the opcode loop (the bound `_MARGIN` needs)
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


def _scan_record(m: Machine, data: Any, p: int, end: int, puts: list[tuple[int, Any]]) -> _Plan:
    """Phase 1 for the record whose args MARK is at `p` of a window (`_window`, `end` its end):
    parse only, raising _Reject on anything unusual.

    Returns (end, persistent id, its position, offset, size, stride, requires_grad, REDUCE position,
    values pushed), positions in the window; memo writes are appended to `puts`.
    """
    memo = m.memo
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


def _room(m: Machine, pushes: int, puts: list[tuple[int, Any]]) -> bool:
    """No limit can be reached by `pushes` more values and these memo writes."""
    lim, memo = m.limits, m.memo
    if m.objects + pushes > lim.max_objects:
        return False
    if not puts or len(memo) + len(puts) <= lim.max_memo:  # the common case, without counting new indices
        return True
    return len(memo) + len({i for i, _ in puts if i not in memo}) <= lim.max_memo


def _commit(m: Machine, plan: _Plan, puts: list[tuple[int, Any]]) -> None:
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


# Every step of a scan moves a bounded number of bytes (strings and names are checked against the
# window's end; LONG1 is at most 8 bytes; puts, fields and dimensions are counted), so a scan reads
# less than `_MARGIN` bytes past its window. The window is read in place when that many bytes of the
# pickle follow it, else from a copy followed by `_MARGIN` zero bytes, which no rule accepts: a scan
# never indexes past its input, and a record that does not fit is "not my shape" (_Reject).
_WINDOW = 1024  # bytes of one record the scanner reads (a 64-d shape with BININT sizes takes ~700)
_MARGIN = 8192


def _window(m: Machine, p: int) -> tuple[Any, int, int]:
    """(data, start, end) to scan the record at pickle position `p` in."""
    if p + _WINDOW + _MARGIN <= m.end:
        return m.data, p, p + _WINDOW
    n = min(m.end - p, _WINDOW)
    return bytes(m.data[p : p + n]) + bytes(_MARGIN), 0, n


def _shifted(plan: _Plan, base: int) -> _Plan:
    end, pid, persid_pos, offset, size, stride, requires_grad, reduce_pos, pushes = plan
    return (end + base, pid, persid_pos + base, offset, size, stride, requires_grad, reduce_pos + base, pushes)


def _fast_rebuild_v2(m: Machine, p: int) -> int:
    """Interpret the `_rebuild_tensor_v2` record whose args MARK is at `p`, then any records that follow
    it as `name, callee, record` pairs of a state_dict; returns where the general loop resumes, or -1
    when it must interpret the record at `p` itself.

    A record the scanner does not read (`_Reject`) is left to the opcode loop; any other exception is
    a bug of the scanner, and propagates.
    """
    lim = m.limits
    if (m.persistent_load is None or len(m.metastack) + 3 > lim.max_marks or len(m.stack) + 1 > lim.max_stack
            or lim.max_stack < 8):
        return -1
    puts: list[tuple[int, Any]] = []
    data, start, n = _window(m, p)
    try:
        plan = _scan_record(m, data, start, n, puts)
    except _Reject:
        return -1
    if not _room(m, plan[-1], puts):
        return -1
    if start != p:
        plan = _shifted(plan, p - start)
    _commit(m, plan, puts)
    q = plan[0]
    end, stack = m.end, m.stack
    max_stack, max_objects = lim.max_stack, lim.max_objects
    while True:  # the next pair: name [put] callee ( record
        if q + 8 > end or m.data[q] not in _NAME_OPS or len(stack) + 3 > max_stack:
            return q
        data, start, n = _window(m, q)
        try:
            name, callee, plan, puts = _scan_pair(m, data, start, n)
        except _Reject:
            return q
        if m.objects + plan[-1] + 2 > max_objects or (puts and not _room(m, plan[-1] + 2, puts)):
            return q
        # the general loop's pushes of the name and the callee (its memo writes come with the record's)
        m.objects += 2
        stack.append(name)
        stack.append(callee)
        if start != q:
            plan = _shifted(plan, q - start)
        _commit(m, plan, puts)
        q = plan[0]


def _scan_pair(m: Machine, data: Any, start: int, end: int) -> tuple[str, Any, _Plan, list[tuple[int, Any]]]:
    """A state_dict's next `name [put] callee [put] ( record` at `start` of `data`, or _Reject."""
    memo = m.memo
    puts: list[tuple[int, Any]] = []
    name, r = _scan_item(data, start, end, memo, puts)
    if type(name) is not str:
        raise _Reject
    if data[r] in _PUT_OPS:
        r = _scan_put(data, r, puts, name)
    c = data[r]
    if c != 0x68 and c != 0x6A:
        raise _Reject
    callee, r = _scan_get(data, r, memo, puts)
    if callee is not _REBUILD_V2 or data[r] != 0x28:
        raise _Reject
    return name, callee, _scan_record(m, data, r, end, puts), puts

"""Parse a GGUF header (key/values and tensor infos) from a ByteSource, as hostile input.

Every count, string length, array length, nesting depth, dimension and offset is checked against
what the rest of the file could hold (and the reader's `Limits`) before anything is allocated; the
Python objects the key/values build are counted against `header_object_bytes` per header byte
(plus `header_object_base`), as the SafeTensors and burnpack readers count theirs. The header is
read in growing windows, never past `max_header_bytes`.

Errors are `FormatError` (or `LimitExceededError`, `UnsupportedDTypeError`) naming the file and,
where there is one, the key or tensor.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.bytesource import ByteSource
from ...core.errors import FormatError, LimitExceededError, UnsupportedDTypeError
from ...core.limits import Limits
from .constants import (
    ALIGNMENT_KEY,
    BY_CODE,
    DEFAULT_ALIGNMENT,
    INTERNAL_TYPES,
    MAGIC,
    MAX_ARRAY_DEPTH,
    MAX_DIMS,
    SCALAR_FORMATS,
    VERSIONS,
    GGMLType,
    ValueType,
)

_I64_MAX = 2**63 - 1
_FIRST_WINDOW = 1 << 20
# Upper bounds, in bytes, of the Python objects one parsed item makes (CPython 64-bit): a str and
# its list slot (plus its length); a Value; an array's list or numpy header.
_STR_COST = 64
_VALUE_COST = 160
_ARRAY_COST = 120
_SUMMARY_ITEMS = 8


class Value(str):
    """A metadata value: its text (what `inspect` shows; long arrays summarised) is the str itself,
    and `type`, `item_type` and `data` keep the typed value for a GGUF writer.

    `data`: an int, float, bool or str (strings keep undecodable bytes as surrogate escapes); an
    array's data is a numpy array of numbers, a list of str, or a list of `Value` (arrays of arrays).
    """

    type: ValueType
    item_type: ValueType | None
    data: Any

    def __new__(cls, vtype: ValueType, data: Any, item_type: ValueType | None = None) -> Value:
        self = super().__new__(cls, _text(vtype, data, item_type))
        self.type, self.item_type, self.data = vtype, item_type, data
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (Value, (self.type, self.data, self.item_type))


def _scalar_text(vtype: ValueType, v: Any) -> str:
    if vtype is ValueType.BOOL:
        return "true" if v else "false"
    if vtype is ValueType.FLOAT32:
        return str(np.float32(v))
    if vtype is ValueType.STRING:
        return str(v)
    return repr(v)


def _text(vtype: ValueType, data: Any, item_type: ValueType | None) -> str:
    if vtype is not ValueType.ARRAY:
        return _scalar_text(vtype, data)
    assert item_type is not None
    n = len(data)
    shown = data[:_SUMMARY_ITEMS]
    if item_type is ValueType.STRING:
        items = [repr(s) for s in shown]
    elif item_type is ValueType.ARRAY:
        items = [str(v) for v in shown]
    else:
        items = [_scalar_text(item_type, v) for v in (shown.tolist() if hasattr(shown, "tolist") else shown)]
    body = ", ".join(items) + (", ..." if n > _SUMMARY_ITEMS else "")
    return f"[{body}]" if n <= _SUMMARY_ITEMS else f"[{n} x {item_type.name}: {body}]"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's record: `dims` in GGUF order (fastest-varying first); `offset` from the data start."""

    name: str
    dims: tuple[int, ...]
    gtype: GGMLType
    offset: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """PyTorch / numpy order: the dims reversed."""
        return self.dims[::-1]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Value]
    tensors: list[TensorInfo]
    alignment: int
    info_end: int  # where the tensor infos end (the data starts at the next multiple of alignment)
    data_start: int


class _Cursor:
    """Sequential little-endian reads from the start of a source, in windows grown as needed."""

    def __init__(self, source: ByteSource, limits: Limits) -> None:
        self.source, self.limits = source, limits
        self.cap = min(source.size, limits.max_header_bytes)
        self.buf = b""
        self.pos = 0
        self.cost = 0

    @property
    def remaining(self) -> int:
        return self.source.size - self.pos

    def need(self, n: int, what: str) -> None:
        end = self.pos + n
        if end <= len(self.buf):
            return
        if end > self.source.size:
            raise FormatError(f"{what} needs bytes [{self.pos}, {end}) but the file has {self.source.size} bytes",
                              file=self.source.label)
        if end > self.cap:
            raise LimitExceededError(f"the GGUF header runs past {self.cap} bytes ({what}); migrator reads at most "
                                     f"{self.limits.max_header_bytes} (max_header_bytes)", file=self.source.label)
        size = min(self.cap, max(end, 2 * len(self.buf), _FIRST_WINDOW))
        self.buf = self.source.read(0, size, "GGUF header")

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, size: int, what: str) -> Any:
        self.need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, what: str) -> int:
        return int(self.unpack("<I", 4, what))

    def u64(self, what: str) -> int:
        return int(self.unpack("<Q", 8, what))

    def charge(self, cost: int, what: str) -> None:
        """Count `cost` bytes of objects; refuse once they pass the budget for the bytes read so far."""
        self.cost += cost
        budget = self.limits.header_object_bytes * self.pos + self.limits.header_object_base
        if self.cost > budget:
            raise LimitExceededError(
                f"{what}: the GGUF key/values would build ~{self.cost} bytes of objects from {self.pos} header bytes, "
                f"over the budget of {self.limits.header_object_bytes} x its size + {self.limits.header_object_base} "
                "(header_object_bytes, header_object_base)", file=self.source.label)

    def string(self, what: str) -> bytes:
        n = self.u64(f"{what} length")
        if n > self.remaining:
            raise FormatError(f"{what} declares {n} bytes but only {self.remaining} follow", file=self.source.label)
        return self.take(n, what)


def _utf8(raw: bytes, what: str, label: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"{what} is not UTF-8 (byte {e.start}: {e.reason})", file=label) from None


def parse_header(source: ByteSource, limits: Limits) -> Header:
    label = source.label
    if source.size < 24:
        raise FormatError(f"too short for GGUF: {source.size} bytes (magic, version and counts take 24)", file=label)
    cur = _Cursor(source, limits)
    magic = cur.take(4, "magic")
    if magic != MAGIC:
        raise FormatError(f"not a GGUF file: magic {magic!r}, expected {MAGIC!r}", file=label)
    raw_version = cur.take(4, "version")
    version = struct.unpack("<I", raw_version)[0]
    if version not in VERSIONS:
        swapped = struct.unpack(">I", raw_version)[0]
        if swapped in VERSIONS or (version & 0xFFFF == 0 and swapped < 0x10000):
            raise FormatError(f"a big-endian GGUF file (version {swapped}); migrator reads little-endian GGUF only "
                              "(convert it with gguf-py's gguf_convert_endian)", file=label)
        raise FormatError(f"GGUF version {version} is not read (versions 2 and 3 are)", file=label)
    n_tensors, n_kv = cur.u64("tensor count"), cur.u64("key/value count")
    if n_tensors > limits.max_tensors:
        raise LimitExceededError(f"declares {n_tensors} tensors; migrator reads at most {limits.max_tensors} "
                                 "(max_tensors)", file=label)
    if n_kv * 13 > cur.remaining:  # a key/value takes at least 8 (key length) + 4 (type) + 1 bytes
        raise FormatError(f"declares {n_kv} key/values but {cur.remaining} bytes cannot hold them", file=label)
    metadata: dict[str, Value] = {}
    for _ in range(n_kv):
        key = _utf8(cur.string("a key"), "a key", label)
        if key in metadata:
            raise FormatError(f"the key '{key}' appears twice", file=label)
        vtype = _value_type(cur.u32(f"the type of key '{key}'"), key, label)
        cur.charge(_VALUE_COST + len(key), key)
        metadata[key] = _read_value(cur, vtype, key, 0)
    alignment = _alignment(metadata, label)
    if n_tensors * 24 > cur.remaining:  # name length 8, dim count 4, type 4, offset 8
        raise FormatError(f"declares {n_tensors} tensors but {cur.remaining} bytes cannot hold their records",
                          file=label)
    infos = [_tensor_info(cur, label) for _ in range(n_tensors)]
    info_end = cur.pos
    data_start = info_end + (-info_end % alignment)
    _check_layout(infos, data_start, alignment, source.size, label)
    return Header(version, metadata, infos, alignment, info_end, data_start)


def _value_type(code: int, key: str, label: str) -> ValueType:
    try:
        return ValueType(code)
    except ValueError:
        raise FormatError(f"key '{key}' has unknown value type {code}", file=label) from None


def _read_value(cur: _Cursor, vtype: ValueType, key: str, depth: int) -> Value:
    label = cur.source.label
    if vtype is ValueType.STRING:
        raw = cur.string(f"the value of key '{key}'")
        cur.charge(_STR_COST + len(raw), key)
        return Value(vtype, raw.decode("utf-8", "surrogateescape"))
    if vtype is not ValueType.ARRAY:
        fmt, _ = SCALAR_FORMATS[vtype]
        return Value(vtype, cur.unpack(fmt, struct.calcsize(fmt), f"the value of key '{key}'"))
    if depth >= MAX_ARRAY_DEPTH:
        raise FormatError(f"key '{key}' nests arrays deeper than {MAX_ARRAY_DEPTH}", file=label)
    item_type = _value_type(cur.u32(f"the item type of key '{key}'"), key, label)
    n = cur.u64(f"the length of key '{key}'")
    cur.charge(_ARRAY_COST, key)
    if item_type is ValueType.STRING:
        if n * 8 > cur.remaining:
            raise FormatError(f"key '{key}' declares {n} strings but {cur.remaining} bytes cannot hold them",
                              file=label)
        cur.charge(8 * n, key)
        return Value(vtype, _strings(cur, n, key), item_type)
    if item_type is ValueType.ARRAY:
        if n * 12 > cur.remaining:
            raise FormatError(f"key '{key}' declares {n} arrays but {cur.remaining} bytes cannot hold them",
                              file=label)
        items = []
        for _ in range(n):
            cur.charge(_VALUE_COST, key)
            items.append(_read_value(cur, ValueType.ARRAY, key, depth + 1))
        return Value(vtype, items, item_type)
    fmt, np_type = SCALAR_FORMATS[item_type]
    width = struct.calcsize(fmt)
    if n * width > cur.remaining:
        raise FormatError(f"key '{key}' declares {n} {item_type.name} values but {cur.remaining} bytes cannot hold "
                          "them", file=label)
    data = np.frombuffer(cur.take(n * width, f"the values of key '{key}'"), dtype=np_type)
    if item_type is ValueType.BOOL:
        data = data.astype(bool)
    return Value(vtype, data, item_type)


def _strings(cur: _Cursor, n: int, key: str) -> list[str]:
    out: list[str] = []
    append = out.append
    for _ in range(n):
        raw = cur.string(f"a string of key '{key}'")
        cur.charge(_STR_COST + len(raw), key)
        append(raw.decode("utf-8", "surrogateescape"))
    return out


def _alignment(metadata: dict[str, Value], label: str) -> int:
    value = metadata.get(ALIGNMENT_KEY)
    if value is None:
        return DEFAULT_ALIGNMENT
    if value.type is not ValueType.UINT32:
        raise FormatError(f"{ALIGNMENT_KEY} must be a UINT32, found {value.type.name}", file=label)
    a = int(value.data)
    if a == 0 or a & (a - 1):
        raise FormatError(f"{ALIGNMENT_KEY} must be a power of two, found {a}", file=label)
    return a


def _tensor_info(cur: _Cursor, label: str) -> TensorInfo:
    name = _utf8(cur.string("a tensor name"), "a tensor name", label)
    n_dims = cur.u32("a dimension count")
    if n_dims > MAX_DIMS:
        raise FormatError(f"has {n_dims} dimensions; GGUF tensors have at most {MAX_DIMS}", file=label, tensor=name)
    cur.need(8 * n_dims, "the dimensions")
    dims = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
    cur.pos += 8 * n_dims
    code = cur.u32("a tensor type")
    offset = cur.u64("a tensor offset")
    gtype = BY_CODE.get(code)
    if gtype is None:
        raise UnsupportedDTypeError(f"unknown ggml type {code}", file=label, tensor=name)
    if gtype.name in INTERNAL_TYPES:
        raise UnsupportedDTypeError(f"ggml type {gtype.name} is ggml's internal dot-product type, not read from "
                                    "files", file=label, tensor=name)
    numel = reach = 1
    for d in dims:  # an empty tensor's other dims too: numpy (and gguf-py) refuse a shape whose bytes,
        numel *= d  # zeros aside, pass 64 bits
        reach *= max(d, 1)
        if reach > _I64_MAX // 8:
            raise FormatError(f"dims {list(dims)} overflow 64-bit element counts", file=label, tensor=name)
    row = dims[0] if dims else 1  # a 0-d tensor is one element, as llama.cpp counts it
    if row % gtype.block_size:
        raise FormatError(f"row of {row} elements is not a multiple of {gtype.name}'s block of "
                          f"{gtype.block_size}", file=label, tensor=name)
    cur.charge(_VALUE_COST + len(name), name)
    return TensorInfo(name, dims, gtype, offset, gtype.nbytes(numel))


def _check_layout(infos: list[TensorInfo], data_start: int, alignment: int, size: int, label: str) -> None:
    """Names unique; offsets aligned, inside the file, and no two tensors' bytes overlapping."""
    names: set[str] = set()
    for t in infos:
        if t.name in names:
            raise FormatError("the tensor name appears twice", file=label, tensor=t.name)
        names.add(t.name)
        if t.offset % alignment:
            raise FormatError(f"data offset {t.offset} is not a multiple of the alignment {alignment}", file=label,
                              tensor=t.name)
        end = data_start + t.offset + t.nbytes
        if end > size:
            raise FormatError(f"data [{data_start + t.offset}, {end}) runs past the end of the file ({size} bytes)",
                              file=label, tensor=t.name)
    ordered = sorted(infos, key=lambda t: t.offset)
    for a, b in itertools.pairwise(ordered):
        if b.offset < a.offset + a.nbytes:
            raise FormatError(f"data at offset {b.offset} overlaps tensor '{a.name}' [{a.offset}, "
                              f"{a.offset + a.nbytes})", file=label, tensor=b.name)


def check_utf8(meta: dict[str, Any], label: str) -> None:
    """Refuse a tokenizer whose strings are not UTF-8, naming the file and the token. GGUF strings are
    UTF-8 (gguf-py and llama.cpp decode them so); the writer keeps a GGUF source's undecodable bytes as
    they were, so a tokenizer file's would otherwise be written into a file its readers refuse."""
    for key, v in meta.items():
        items = [v.data] if v.type is ValueType.STRING else v.data if v.item_type is ValueType.STRING else []
        for i, text in enumerate(items):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                where = key if v.type is ValueType.STRING else f"{key}[{i}]"
                raise FormatError(f"{where} ({text[:40]!a}) is not valid UTF-8 text", file=label) from None

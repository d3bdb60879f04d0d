"""The CBOR subset burnpack uses, encoded exactly as Burn's ciborium + serde do.

A hand-written codec, because no library matches Burn alone (cbor2 writes every float as a
double, and its canonical mode reorders keys) and because the decoder must bound depth and
lengths before allocating anything for a hostile file.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

from ..core.limits import DEFAULT_LIMITS, Limits

MAX_DEPTH = 128  # Burn's: deeper input is refused by Burn too, so it is not a `Limits` field
# What decoding may build: `limits.header_object_bytes` x the input + `limits.header_object_base`
# bytes of Python objects, counted per object created (an empty map is one byte of CBOR and ~80
# bytes of Python), charged before each container is allocated. With the input itself, the
# defaults keep a header within SECURITY.md's 16 x input + 64 MiB.
_TEXT_CACHE = 4096  # distinct short texts shared per document (field names, dtypes repeat per tensor)
_SHORT_TEXT = 64


class CborError(ValueError):
    """Malformed or over-deep CBOR."""


class CborLimitError(CborError):
    """Well-formed CBOR that would build more objects than its size justifies."""


class RawCbor(bytes):
    """Already-encoded CBOR inserted verbatim (keeps a QFloat scheme byte for byte)."""


class CborMap(list[tuple[Any, Any]]):
    """A decoded map as its (key, value) pairs in file order, so repeated keys stay visible."""

    __slots__ = ()  # no per-map __dict__: a hostile header can hold millions of maps

    def get_unique(self, key: str, where: str) -> Any:
        found = [v for k, v in self if k == key]
        if len(found) > 1:
            raise CborError(f"{where}: duplicate field '{key}'")
        return found[0] if found else _MISSING

    def last_wins(self) -> dict[Any, Any]:
        return dict(self)


_MISSING: Any = object()
MISSING = _MISSING


# ---------------------------------------------------------------------------------------- encode


_SMALL_HEADS = tuple(tuple(bytes([(major << 5) | n]) for n in range(24)) for major in range(8))


def _head(major: int, n: int) -> bytes:
    if n < 24:
        return _SMALL_HEADS[major][n]
    if n < 1 << 8:
        return bytes([(major << 5) | 24, n])
    if n < 1 << 16:
        return bytes([(major << 5) | 25]) + n.to_bytes(2, "big")
    if n < 1 << 32:
        return bytes([(major << 5) | 26]) + n.to_bytes(4, "big")
    if n < 1 << 64:
        return bytes([(major << 5) | 27]) + n.to_bytes(8, "big")
    raise CborError(f"integer {n} does not fit in 64 bits")


_PACK_U8, _PACK_U16, _PACK_U32, _PACK_U64 = (struct.Struct(f">B{c}").pack for c in "BHIQ")


def encode_uint(n: int) -> bytes:
    """The shortest encoding of an unsigned integer below 2**64 (`encode(n)`, in one call)."""
    if n < 24:
        return _SMALL_HEADS[0][n]
    if n < 1 << 8:
        return _PACK_U8(0x18, n)
    if n < 1 << 16:
        return _PACK_U16(0x19, n)
    if n < 1 << 32:
        return _PACK_U32(0x1A, n)
    if n < 1 << 64:
        return _PACK_U64(0x1B, n)
    raise CborError(f"integer {n} does not fit in 64 bits")


def encode_float(x: float) -> bytes:
    """Shortest IEEE width that round-trips the exact f64 bit pattern (half, single, double)."""
    bits = struct.pack(">d", x)
    for code, head in (("e", b"\xf9"), ("f", b"\xfa")):
        try:
            narrow = struct.pack(">" + code, x)
        except OverflowError:
            continue
        if struct.pack(">d", struct.unpack(">" + code, narrow)[0]) == bits:
            return head + narrow
    return b"\xfb" + bits


def encode_into(out: bytearray, value: Any) -> None:
    """Append the encoding of `value` to `out` (lets a writer encode a big map entry by entry)."""
    _encode_into(out, value)


def head(major: int, n: int) -> bytes:
    """The shortest head of major type `major` with argument `n` (0 = uint, 4 = array, 5 = map)."""
    return _head(major, n)


def encode(value: Any) -> bytes:
    """Encode dicts (in insertion order), lists, str, int, float, bool, None and RawCbor."""
    out = bytearray()
    _encode_into(out, value)
    return bytes(out)


_TEXT: dict[str, bytes] = {}


def _encode_into(out: bytearray, v: Any) -> None:
    # Exact-type fast paths first (a 100k-tensor header is ~1M items); subclasses, bools, None,
    # floats and RawCbor take the general chain below.
    t = type(v)
    if t is str:
        b = _TEXT.get(v)
        if b is None:
            raw = v.encode("utf-8")
            b = _head(3, len(raw)) + raw
            if len(_TEXT) < 4096:  # field names and dtypes repeat once per tensor
                _TEXT[v] = b
        out += b
    elif t is int:
        out += _head(0, v) if v >= 0 else _head(1, -1 - v)
    elif t is dict:
        out += _head(5, len(v))
        for k, item in v.items():
            _encode_into(out, k)
            _encode_into(out, item)
    elif t is list or t is tuple:
        out += _head(4, len(v))
        for item in v:
            _encode_into(out, item)
    else:
        _encode_other(out, v)


def _encode_other(out: bytearray, v: Any) -> None:
    if isinstance(v, RawCbor):
        out += v
    elif v is None:
        out += b"\xf6"
    elif v is True:
        out += b"\xf5"
    elif v is False:
        out += b"\xf4"
    elif isinstance(v, int):
        out += _head(0, v) if v >= 0 else _head(1, -1 - v)
    elif isinstance(v, float):
        out += encode_float(v)
    elif isinstance(v, str):
        b = v.encode("utf-8")
        out += _head(3, len(b)) + b
    elif isinstance(v, bytes | bytearray):
        out += _head(2, len(v)) + bytes(v)
    elif isinstance(v, dict):
        out += _head(5, len(v))
        for k, item in v.items():
            _encode_into(out, k)
            _encode_into(out, item)
    elif isinstance(v, list | tuple):
        out += _head(4, len(v))
        for item in v:
            _encode_into(out, item)
    else:
        raise CborError(f"cannot encode {type(v).__name__}")


# ---------------------------------------------------------------------------------------- decode


def decode(data: bytes | memoryview, max_depth: int = MAX_DEPTH, *, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Decode the first CBOR item (trailing bytes are ignored, as Burn does).

    Maps come back as `CborMap`; every declared length is checked against the bytes left before
    anything is allocated, and nesting deeper than `max_depth` is refused.
    """
    dec = _Decoder(bytes(data), max_depth, limits)
    return dec.item(0)


def decode_at(data: bytes, pos: int, depth: int, max_depth: int = MAX_DEPTH, *,
              limits: Limits = DEFAULT_LIMITS) -> tuple[Any, int]:
    """Decode the item at `pos` as if nested `depth` levels deep; returns it and the position after it.

    Lets a reader parse the common part of a document itself and leave the rest to this decoder,
    with the same bounds, depth limit and errors as a whole-document `decode`.
    """
    dec = _Decoder(data, max_depth, limits)
    dec.pos = pos
    return dec.item(depth), dec.pos


# Bytes charged per object, from CPython's sizes on 64-bit builds, GC header included (rounded up).
_INT_COST = 40  # ints below 256 are shared and free
_FLOAT_COST = 24
_LIST_COST = 80  # a list or CborMap, plus 8 bytes per item
_PAIR_COST = 80  # a map's (key, value) tuple, plus its slot in the map


class _Decoder:
    def __init__(self, data: bytes, max_depth: int, limits: Limits) -> None:
        self.data = data
        self.pos = 0
        self.max_depth = max_depth
        self.limits = limits
        self.budget = limits.header_object_bytes * len(data) + limits.header_object_base
        self.left = self.budget
        self.texts: dict[bytes, str] = {}

    def _charge(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise CborLimitError(f"the CBOR would build more than {self.budget} bytes of objects from "
                                 f"{len(self.data)} bytes (at byte {self.pos}); the budget is "
                                 f"{self.limits.header_object_bytes} x its size + {self.limits.header_object_base} "
                                 "bytes (header_object_bytes, header_object_base)")

    def _take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise CborError(f"truncated CBOR at byte {self.pos}: need {n} more bytes")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def _arg(self, info: int) -> int | None:
        if info < 24:
            return info
        if info == 24:
            return self._take(1)[0]
        if info == 25:
            return int.from_bytes(self._take(2), "big")
        if info == 26:
            return int.from_bytes(self._take(4), "big")
        if info == 27:
            return int.from_bytes(self._take(8), "big")
        if info == 31:
            return None  # indefinite length
        raise CborError(f"reserved additional info {info} at byte {self.pos - 1}")

    def _at_break(self) -> bool:
        if self.pos >= len(self.data):
            raise CborError("truncated CBOR: missing break")
        if self.data[self.pos] == 0xFF:
            self.pos += 1
            return True
        return False

    def item(self, depth: int) -> Any:
        if depth > self.max_depth:
            raise CborError(f"CBOR nesting deeper than {self.max_depth} levels")
        ib = self._take(1)[0]
        major, info = ib >> 5, ib & 31
        if major == 7:
            return self._simple(info)
        n = self._arg(info)
        if major == 0 or major == 1:
            if n is None:
                raise CborError("indefinite-length integer")
            if n > 255:
                self._charge(_INT_COST)
            return n if major == 0 else -1 - n
        if major in (2, 3):
            raw = self._chunks(major) if n is None else self._take(n)
            if major == 2:
                self._charge(sys.getsizeof(raw))
                return raw
            text = self.texts.get(raw)
            if text is not None:
                return text
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise CborError(f"invalid UTF-8 in text string: {e}") from None
            self._charge(sys.getsizeof(text))
            if len(raw) <= _SHORT_TEXT and len(self.texts) < _TEXT_CACHE:
                self.texts[raw] = text
            return text
        if major == 4:
            items = []
            if n is None:
                self._charge(_LIST_COST)
                while not self._at_break():
                    self._charge(8)
                    items.append(self.item(depth + 1))
            else:
                self._bound(n, 1)
                self._charge(_LIST_COST + 8 * n)
                items = [self.item(depth + 1) for _ in range(n)]
            return items
        if major == 5:
            pairs = CborMap()
            if n is None:
                self._charge(_LIST_COST)
                while not self._at_break():
                    self._charge(_PAIR_COST)
                    k = self.item(depth + 1)
                    pairs.append((k, self.item(depth + 1)))
            else:
                self._bound(n, 2)
                self._charge(_LIST_COST + _PAIR_COST * n)
                for _ in range(n):
                    k = self.item(depth + 1)
                    pairs.append((k, self.item(depth + 1)))
            for k, _ in pairs:
                if isinstance(k, list | CborMap):
                    raise CborError("map key is a container")
            return pairs
        # major 6: a tag; serde ignores tags on the types burnpack uses
        if n is None:
            raise CborError("indefinite-length tag")
        return self.item(depth + 1)

    def _bound(self, count: int, min_bytes_each: int) -> None:
        if count * min_bytes_each > len(self.data) - self.pos:
            raise CborError(f"CBOR container declares {count} items but only {len(self.data) - self.pos} "
                            "bytes remain")

    def _chunks(self, major: int) -> bytes:
        parts = []
        while not self._at_break():
            ib = self._take(1)[0]
            if ib >> 5 != major:
                raise CborError("mixed chunk types in indefinite string")
            n = self._arg(ib & 31)
            if n is None:
                raise CborError("nested indefinite string")
            parts.append(self._take(n))
        return b"".join(parts)

    def _simple(self, info: int) -> Any:
        if info == 20:
            return False
        if info == 21:
            return True
        if info in (22, 23):
            return None
        if info in (25, 26, 27):
            self._charge(_FLOAT_COST)
            if info == 25:
                return struct.unpack(">e", self._take(2))[0]
            if info == 26:
                return struct.unpack(">f", self._take(4))[0]
            return struct.unpack(">d", self._take(8))[0]
        if info == 24:
            self._take(1)
            raise CborError("unsupported simple value")
        raise CborError(f"unsupported simple value {info}")


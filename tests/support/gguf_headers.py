"""Shared test helpers (gguf_headers); moved from the test files that first needed them."""

from __future__ import annotations

import struct

from migrator.core.errors import FormatError, LimitExceededError, MigratorError, UnsupportedDTypeError

STRING, ARRAY, UINT32 = 8, 9, 4


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def info(name: str, dims: list[int], gtype: int = 0, offset: int = 0) -> bytes:
    return s(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, gtype, offset)


def gguf(kvs: list[bytes] = (), infos: list[bytes] = (), *, data: bytes = b"", version: int = 3,
         n_tensors: int | None = None, n_kv: int | None = None, align: int = 32) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos)
    return head + bytes(-len(head) % align) + data


def nested(depth: int) -> bytes:
    """An ARRAY-typed value payload: arrays of arrays `depth` deep, each holding one array."""
    inner = struct.pack("<IQ", UINT32, 0)
    for _ in range(depth - 1):
        inner = struct.pack("<IQ", ARRAY, 1) + inner
    return inner


CASES: dict[str, tuple[bytes, type[MigratorError], str]] = {
    "tensor count huge": (gguf(n_tensors=2**63), LimitExceededError, "max_tensors"),
    "tensor count past the file": (gguf(n_tensors=50_000), FormatError, "cannot hold"),
    "kv count huge": (gguf(n_kv=2**62), FormatError, "cannot hold"),
    "key length past the end": (gguf([struct.pack("<Q", 2**50) + b"k"]), FormatError, "follow"),
    "string value past the end": (gguf([kv("k", STRING, struct.pack("<Q", 2**40) + b"x")]), FormatError, "follow"),
    "array of u32 huge": (gguf([kv("k", ARRAY, struct.pack("<IQ", UINT32, 2**60))]), FormatError, "cannot hold"),
    "array of strings huge": (gguf([kv("k", ARRAY, struct.pack("<IQ", STRING, 2**61))]), FormatError, "cannot hold"),
    "array of arrays huge": (gguf([kv("k", ARRAY, struct.pack("<IQ", ARRAY, 2**59))]), FormatError, "cannot hold"),
    "arrays nested deep": (gguf([kv("k", ARRAY, nested(64))]), FormatError, "deeper"),
    "unknown value type": (gguf([kv("k", 13, b"")]), FormatError, "unknown value type 13"),
    "unknown array item type": (gguf([kv("k", ARRAY, struct.pack("<IQ", 99, 1))]), FormatError, "99"),
    "key not utf-8": (gguf([s(b"\xff\xfe") + struct.pack("<II", UINT32, 0)]), FormatError, "UTF-8"),
    "duplicate key": (gguf([kv("k", UINT32, b"\0" * 4)] * 2), FormatError, "twice"),
    "alignment not u32": (gguf([kv("general.alignment", STRING, s("32"))]), FormatError, "UINT32"),
    "alignment not a power of two": (gguf([kv("general.alignment", UINT32, struct.pack("<I", 48))], align=48),
                                     FormatError, "power of two"),
    "unknown ggml type": (gguf(infos=[info("t", [4], 77)], data=bytes(16)), UnsupportedDTypeError, "77"),
    "internal ggml type": (gguf(infos=[info("t", [256], 15)], data=bytes(292)), UnsupportedDTypeError, "Q8_K"),
    "five dims": (gguf(infos=[info("t", [1, 1, 1, 1, 1])], data=bytes(32)), FormatError, "dimensions"),
    "dims overflow": (gguf(infos=[info("t", [2**40, 2**40, 0])]), FormatError, "overflow"),
    "row not whole blocks": (gguf(infos=[info("t", [33], 8)], data=bytes(64)), FormatError, "multiple"),
    "misaligned offset": (gguf(infos=[info("t", [4], 0, 4)], data=bytes(64)), FormatError, "alignment"),
    "offset past the end": (gguf(infos=[info("t", [4], 0, 2**60)], data=bytes(64)), FormatError, "past the end"),
    "tensor past the end": (gguf(infos=[info("t", [2**30])], data=bytes(64)), FormatError, "past the end"),
    "overlapping tensors": (gguf(infos=[info("a", [16]), info("b", [16], 0, 32)], data=bytes(128)), FormatError,
                            "overlaps"),
    "duplicate tensor": (gguf(infos=[info("a", [4]), info("a", [4], 0, 32)], data=bytes(64)), FormatError, "twice"),
    "version 1": (gguf(version=1), FormatError, "version 1"),
    "version 4": (gguf(version=4), FormatError, "version 4"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), FormatError, "big-endian"),
    "too short": (b"GGUF\x03\x00\x00\x00", FormatError, "too short"),
}

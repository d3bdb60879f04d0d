"""Hostile GGUF headers: each gives a typed error, within the time and allocation bounds every
reader is held to (`test_hostile.outcome`: SIGALRM limit, tracemalloc peak <= 16 x input + 8 MiB)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf_support import write_gguf
from test_hostile import outcome

from migrator.core.errors import FormatError, LimitExceededError, MigratorError, UnsupportedDTypeError
from migrator.core.limits import DEFAULT_LIMITS

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


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_header(tmp_path: Path, name: str) -> None:
    data, kind, words = CASES[name]
    path = tmp_path / "h.gguf"
    path.write_bytes(data)
    err = outcome(path, seconds=10)
    assert isinstance(err, kind), f"{name}: {type(err).__name__}: {err}"
    assert words in str(err) and str(path) in str(err), str(err)


def test_header_bigger_than_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.gguf"
    path.write_bytes(gguf([kv("k", STRING, s("x" * 300_000))]))
    err = outcome(path, limits=DEFAULT_LIMITS.replace(max_header_bytes=100_000))
    assert isinstance(err, LimitExceededError) and "max_header_bytes" in str(err)


def test_many_small_strings_hit_the_object_budget(tmp_path: Path) -> None:
    """One-byte strings: 9 file bytes build a ~64-byte str each, over a per-byte budget of 4."""
    n = 200_000
    path = tmp_path / "strings.gguf"
    path.write_bytes(gguf([kv("k", ARRAY, struct.pack("<IQ", STRING, n) + s("a") * n)]))
    err = outcome(path, limits=DEFAULT_LIMITS.replace(header_object_bytes=4, header_object_base=1 << 20))
    assert isinstance(err, LimitExceededError) and "header_object_bytes" in str(err)


def test_every_truncation_of_a_valid_file_is_a_clean_error(tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    valid = write_gguf(tmp_path / "v.gguf", {"a": (x, "Q8_0"), "b": (x, "F32")},
                       kv={"tokenizer.ggml.tokens": ["a", "bc"], "general.name": "v"}).read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in [*range(0, 400, 7), len(valid) - 1]:
        cut.write_bytes(valid[:n])
        err = outcome(cut, seconds=10)
        assert isinstance(err, FormatError), (n, err)


@pytest.mark.parametrize("raw", [b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x0a\x80", b"\x0a\x05ab",
                                 b"\x0f", b"", b"\x12\x02\xa0\x02"])
def test_hostile_sentencepiece_models(tmp_path: Path, raw: bytes) -> None:
    """Overlong varints, lengths past the end, unknown wire types, no pieces: a FormatError naming it."""
    from migrator.formats.gguf.tokenizer import tokenizer_metadata

    path = tmp_path / "tokenizer.model"
    path.write_bytes(raw)
    with pytest.raises(FormatError) as e:
        tokenizer_metadata(path)
    assert str(path) in str(e.value)


def test_limits_move_for_gguf(tmp_path: Path) -> None:
    """max_tensors and max_header_bytes given to open_file move the GGUF reader's bounds too."""
    import migrator
    from migrator.core.limits import Limits

    x = np.ones((2, 32), np.float32)
    path = write_gguf(tmp_path / "three.gguf", {"a": (x, "F32"), "b": (x, "Q8_0"), "c": (x, "F32")})
    with pytest.raises(LimitExceededError, match="max_tensors"):
        migrator.open_file(path, limits=Limits(max_tensors=2))
    with pytest.raises(LimitExceededError, match="max_header_bytes"):
        migrator.open_file(path, limits=DEFAULT_LIMITS.replace(max_header_bytes=64))
    with migrator.open_file(path) as r:
        assert len(r) == 3

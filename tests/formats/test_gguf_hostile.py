"""Hostile GGUF headers: each gives a typed error, within the time and allocation bounds every
reader is held to (`test_hostile.outcome`: SIGALRM limit, tracemalloc peak <= 16 x input + 8 MiB)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from migrator.core.errors import FormatError, LimitExceededError
from migrator.core.limits import DEFAULT_LIMITS
from tests.support.gguf_files import write_gguf
from tests.support.gguf_headers import ARRAY, CASES, STRING, gguf, kv, s
from tests.support.pickles import outcome


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

"""Hostile tokenizer files given to `migrate convert HF_FOLDER out.gguf`: a `tokenizer.json`,
`tokenizer.model` or `tokenizer_config.json` built to break the converter. Every case goes through
the command line and is held to the same promises (`hostile.refused`): exit 1 or 2, one
line naming the file, no traceback, no output and no scratch file, an existing target unchanged,
bounded time. A case is a folder file name and its bytes; the model's weights are always fine."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from tests.support.hostile import refused
from tests.support.tokenizer_files import VOCAB, bpe, hf_llama


def pb_field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (number < 16, payload < 128 bytes)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def piece(text: bytes, score: float = 0.0, kind: int = 1) -> bytes:
    return pb_field(1, pb_field(1, text) + b"\x15" + struct.pack("<f", score) + bytes([0x18, kind]))


# name -> {file name: contents}; each replaces or adds one file in a good folder
CASES: dict[str, dict[str, str | bytes]] = {
    # tokenizer.json
    "json not json": {"tokenizer.json": "{not json"},
    "json empty file": {"tokenizer.json": ""},
    "json a list": {"tokenizer.json": "[1, 2]"},
    "json nested deep": {"tokenizer.json": "[" * 100_000 + "]" * 100_000},
    "json NaN": {"tokenizer.json": '{"model": {"type": "BPE", "vocab": {"a": NaN}}}'},
    "json not utf-8": {"tokenizer.json": b'{"model": "\xff\xfe"}'},
    "json lone surrogate key": {"tokenizer.json": bpe(vocab={"\ud800": 0})},
    "vocab a list": {"tokenizer.json": bpe(vocab=["a", "b"])},
    "vocab id huge": {"tokenizer.json": bpe(vocab={"a": 2**62})},
    "vocab id float": {"tokenizer.json": bpe(vocab={"a": 1.5})},
    "vocab id negative": {"tokenizer.json": bpe(vocab={"a": -1})},
    "vocab id bool": {"tokenizer.json": bpe(vocab={"a": True})},
    "vocab id big integer": {"tokenizer.json": bpe(vocab={"a": 10**400})},
    "vocab past vocab_size": {"tokenizer.json": bpe(vocab={"a": 0, "b": VOCAB})},
    "vocab empty": {"tokenizer.json": bpe(vocab={})},
    "merges not a list": {"tokenizer.json": bpe(merges="a b")},
    "merge of three": {"tokenizer.json": bpe(merges=["a b c"])},
    "merge pair of lists": {"tokenizer.json": bpe(merges=[[["a"], "b"]])},
    "merge a number": {"tokenizer.json": bpe(merges=[7])},
    "added tokens not a list": {"tokenizer.json": bpe(added_tokens={"id": 3})},
    "added token id missing": {"tokenizer.json": bpe(added_tokens=[{"content": "x"}])},
    "added token id huge": {"tokenizer.json": bpe(added_tokens=[{"id": 2**40, "content": "x"}])},
    "added token content a list": {"tokenizer.json": bpe(added_tokens=[{"id": 3, "content": ["x"]}])},
    "added token past vocab_size": {"tokenizer.json": bpe(added_tokens=[{"id": 100, "content": "x"}])},
    "merge lone surrogate": {"tokenizer.json": bpe(merges=["\ud800 b"])},
    "added token lone surrogate": {"tokenizer.json": bpe(added_tokens=[{"id": 3, "content": "\udcff"}])},
    "chat template lone surrogate": {"tokenizer.json": bpe(), "tokenizer_config.json": '{"chat_template": "\\ud800"}'},
    # tokenizer.model (SentencePiece protobuf)
    "spm empty": {"tokenizer.model": b""},
    "spm overlong varint": {"tokenizer.model": b"\x0a" + b"\xff" * 11 + b"\x01"},
    "spm length past the end": {"tokenizer.model": b"\x0a\x80\x80\x80\x80\x08"},
    "spm unknown wire type": {"tokenizer.model": b"\x0f"},
    "spm group wire type": {"tokenizer.model": b"\x0b\x0c"},
    "spm piece not utf-8": {"tokenizer.model": piece(b"\xff\xfe")},
    "spm piece past the embedding": {"tokenizer.model": b"".join(piece(bytes([97 + i])) for i in range(VOCAB + 1))},
    "spm piece fixed64 truncated": {"tokenizer.model": pb_field(1, pb_field(1, b"a") + b"\x11\x00")},
    "spm second piece not utf-8": {"tokenizer.model": piece(b"a") + piece(b"b\xc3")},
    "spm nested message past its parent": {"tokenizer.model": pb_field(1, b"\x0a\x7f")},
    "spm random bytes": {"tokenizer.model": np.random.default_rng(3).bytes(4096)},
}


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_llama(tmp_path_factory.mktemp("tok") / "hf")


def _folder(good: Path, tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    folder = tmp_path / "hf"
    folder.mkdir()
    for p in good.iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    for name, content in files.items():
        (folder / name).write_bytes(content.encode("utf-8", "surrogatepass") if isinstance(content, str)
                                    else content)
    return folder


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_tokenizer_is_refused_cleanly(good: Path, tmp_path: Path, name: str) -> None:
    folder = _folder(good, tmp_path, CASES[name])
    out = tmp_path / "m.gguf"
    refused(["convert", str(folder), str(out)], tmp_path, words=str(folder / next(iter(CASES[name]))))


@pytest.mark.parametrize("name", ["json nested deep", "vocab id huge", "spm length past the end"])
def test_an_existing_target_survives(good: Path, tmp_path: Path, name: str) -> None:
    folder = _folder(good, tmp_path, CASES[name])
    out = tmp_path / "m.gguf"
    out.write_bytes(b"the old model")
    refused(["convert", str(folder), str(out), "--overwrite"], tmp_path)
    assert out.read_bytes() == b"the old model"


def test_the_good_folder_converts(good: Path, tmp_path: Path) -> None:
    """The corpus's base is sound: each refusal above is the broken file's."""
    folder = _folder(good, tmp_path, {"tokenizer.json": bpe()})
    from tests.support.cli import migrate_in_process

    done = migrate_in_process("convert", str(folder), str(tmp_path / "m.gguf"))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("case", ["tokenizer.json a FIFO", "tokenizer_config.json a FIFO",
                                  "tokenizer_config.json nested deep"])
def test_special_companion_files_end(good: Path, tmp_path: Path, case: str) -> None:
    """A FIFO is never opened for a blocking read, deep JSON never recurses: the run ends, refused
    with the promises or written (a companion that cannot be read counts as absent)."""
    import os

    from tests.support.alarm import alarm
    from tests.support.cli import migrate_in_process

    spm = piece(b"<unk>", kind=2) + piece(b"a") + piece(b"b")
    folder = _folder(good, tmp_path, {} if case.startswith("tokenizer.json") else {"tokenizer.model": spm})
    if case == "tokenizer_config.json nested deep":
        (folder / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    else:
        os.mkfifo(folder / case.split()[0])
    with alarm(20, f"{case}: the run did not end"):
        done = migrate_in_process("convert", str(folder), str(tmp_path / "m.gguf"))
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 1, done.stderr
    assert done.returncode in (0, 1, 2), done.stderr

"""Hostile GGUF through the command line: every header of test_gguf_hostile.py given to `migrate
convert` (reading), split sets whose files disagree with their names or with each other, and GGUF
targets given metadata the format cannot hold (writing, single and split).

Every case is held to the same promises (`hostile.refused`): exit 1 or 2, one line naming
the file, no traceback, no output or scratch file (no split file either), an existing target
unchanged, bounded time."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.support.gguf_files import copy_gguf, split_with_gguf_py, write_gguf
from tests.support.gguf_headers import CASES as HEADERS
from tests.support.gguf_headers import gguf, info, kv, s
from tests.support.hostile import refused

STRING, UINT16, INT32 = 8, 2, 5
X = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_hostile_header_through_the_cli(tmp_path: Path, name: str) -> None:
    src = tmp_path / "h.gguf"
    src.write_bytes(HEADERS[name][0])
    refused(["convert", str(src), str(tmp_path / "out.safetensors")], tmp_path, words=str(src))


# ---------------------------------------------------------------------------------------------------
# split sets: built by gguf-py's split writer (3 files of one tensor each), then one thing broken

SplitChange = Callable[[Path, list[Path]], None]  # (folder, the files in order)


def _one_file(tensors: dict[str, str], *, no: int, count: int, total: int, extra: list[bytes] = ()) -> bytes:
    """A split file by hand: split.* keys, then one F32 [4, 32] tensor per name (row-major data)."""
    kvs = [kv("general.architecture", STRING, s("llama")), kv("split.no", UINT16, struct.pack("<H", no)),
           kv("split.count", UINT16, struct.pack("<H", count)),
           kv("split.tensors.count", INT32, struct.pack("<i", total)), *extra]
    infos = [info(n, [32, 4], 0, i * X.nbytes) for i, n in enumerate(tensors)]
    return gguf(kvs, infos, data=X.tobytes() * len(tensors))


def _replace(index: int, data: Callable[[list[Path]], bytes]) -> SplitChange:
    def change(folder: Path, files: list[Path]) -> None:
        files[index].write_bytes(data(files))
    return change


def _rename(index: int, to: str) -> SplitChange:
    def change(folder: Path, files: list[Path]) -> None:
        files[index].rename(folder / to)
    return change


def _remove(index: int) -> SplitChange:
    def change(folder: Path, files: list[Path]) -> None:
        files[index].unlink()
    return change


SPLITS: dict[str, SplitChange] = {
    "a part missing": _remove(1),
    "the last part missing": _remove(2),
    "a part truncated": _replace(1, lambda f: f[1].read_bytes()[:100]),
    "a part empty": _replace(2, lambda f: b""),
    "a part not GGUF": _replace(1, lambda f: b"PK\x03\x04" + bytes(200)),
    "a part repeating a tensor": _replace(1, lambda f: _one_file({"a": ""}, no=1, count=3, total=3)),
    "a part with another tensor shape": _replace(1, lambda f: f[0].read_bytes()),
    "a count of zero": _rename(0, "model-00001-of-00000.gguf"),
    "a count beyond the limit": _rename(0, "model-00001-of-99999.gguf"),
    "a part read alone": _rename(1, "alone.gguf"),
    "a part of another set": _replace(2, lambda f: _one_file({"c": ""}, no=2, count=4, total=4)),
}


@pytest.fixture
def split(tmp_path: Path) -> tuple[Path, list[Path]]:
    x = {n: (X, "F32") for n in ("a", "b", "c")}
    (tmp_path / "src").mkdir()
    src = write_gguf(tmp_path / "src" / "whole.gguf", x)
    folder = tmp_path / "w" / "split"
    files = split_with_gguf_py(src, folder, 1)
    assert len(files) == 3
    return folder, files


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_hostile_split_set_is_refused_cleanly(split: tuple[Path, list[Path]], tmp_path: Path, name: str) -> None:
    folder, files = split
    SPLITS[name](folder, files)
    named = sorted(folder.iterdir())[0]
    done = refused(["convert", str(named), str(tmp_path / "w" / "out.safetensors")], tmp_path / "w")
    assert str(folder) in done.stderr, done.stderr


# ---------------------------------------------------------------------------------------------------
# writing: --metadata the GGUF writer must refuse before a byte is written, single file and split

BAD_METADATA = [
    ("general.alignment=3", "general.alignment"),
    ("general.alignment=0", "general.alignment"),
    ("general.alignment=-32", "general.alignment"),
    ("general.alignment=4294967296", "general.alignment"),
    ("general.alignment=64x", "general.alignment"),
    ("split.count=7", "split.count"),
    ("split.tensors.count=1", "split.tensors.count"),
    ("llama.rope.freq_base=1e39", "llama.rope.freq_base"),
    ("llama.attention.layer_norm_rms_epsilon=nan", "layer_norm_rms_epsilon"),
    ("llama.block_count=-1", "llama.block_count"),
    ("tokenizer.ggml.tokens=abc", "tokenizer.ggml.tokens"),
]


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gw") / "m.gguf", {"a": (X, "F32"), "b": (X, "Q8_0")})


@pytest.mark.parametrize(("entry", "words"), BAD_METADATA, ids=[e for e, _ in BAD_METADATA])
@pytest.mark.parametrize("target", ["out.gguf", "out/"])
def test_metadata_a_gguf_cannot_hold_is_refused(src: Path, tmp_path: Path, entry: str, words: str,
                                                target: str) -> None:
    args = ["convert", str(src), str(tmp_path / target), "--metadata", entry]
    if target.endswith("/"):
        args += ["--to", "gguf", "--max-shard-size", "300"]
    refused(args, tmp_path, words=words)


def test_an_existing_split_target_survives(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "m-00001-of-00002.gguf").write_bytes(b"old one")
    (out / "m-00002-of-00002.gguf").write_bytes(b"old two")
    refused(["convert", str(src), str(out) + "/", "--to", "gguf", "--max-shard-size", "300", "--overwrite",
             "--metadata", "general.alignment=3"], tmp_path)


def test_the_good_inputs_convert(split: tuple[Path, list[Path]], src: Path, tmp_path: Path) -> None:
    """The corpus's split set and source are sound: each refusal above is the broken part's."""
    from tests.support.cli import migrate_in_process

    _, files = split
    done = migrate_in_process("convert", str(files[0]), str(tmp_path / "a.safetensors"))
    assert done.returncode == 0, done.stderr
    done = migrate_in_process("convert", str(src), str(tmp_path / "o") + "/", "--to", "gguf", "--max-shard-size", "300")
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "o").glob("*.gguf"))) > 1


# ---------------------------------------------------------------------------------------------------
# GGUF -> Hugging Face folder: the tokenizer key/values a tokenizer.json is written from. A good
# GGUF (converted from a Llama folder with a byte-level BPE tokenizer.json) copied by gguf-py's
# writer with one key's type or value replaced.

def _retyped(src: Path, dst: Path, key: str, value: object, vtype: str, sub: str | None = None) -> None:
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "llama")
    # a SentencePiece ("llama") vocabulary: the model key and the scores it needs, unless the case sets them
    spm = {"tokenizer.ggml.model": ("llama", "STRING", None),
           "tokenizer.ggml.scores": ([0.0] * 8, "ARRAY", "FLOAT32")} if key.startswith("spm:") else {}
    key = key.removeprefix("spm:")
    replaced = {**spm, key: (value, vtype, sub)}
    copy_gguf(r, w, replaced)


# (key, value, GGUF type, item type)
TOKENIZER_KVS: dict[str, tuple[str, object, str, str | None]] = {
    "tokens a string": ("tokenizer.ggml.tokens", "abcdefgh", "STRING", None),
    "tokens integers": ("tokenizer.ggml.tokens", list(range(8)), "ARRAY", "UINT32"),
    "tokens not utf-8": ("tokenizer.ggml.tokens", [b"a", b"\xff\xfe", *[bytes([99 + i]) for i in range(6)]],
                         "ARRAY", "STRING"),
    "tokens too few for the embedding": ("tokenizer.ggml.tokens", ["a", "b"], "ARRAY", "STRING"),
    "token types strings": ("tokenizer.ggml.token_type", ["1"] * 8, "ARRAY", "STRING"),
    "token types a number": ("tokenizer.ggml.token_type", 1, "INT32", None),
    "token types huge": ("tokenizer.ggml.token_type", [2**31 - 1] * 8, "ARRAY", "INT32"),
    "merges integers": ("tokenizer.ggml.merges", [1, 2], "ARRAY", "UINT32"),
    "merges not pairs": ("tokenizer.ggml.merges", ["abc"], "ARRAY", "STRING"),
    "merges a string": ("tokenizer.ggml.merges", "a b", "STRING", None),
    "bos id past the tokens": ("tokenizer.ggml.bos_token_id", 2**31, "UINT32", None),
    "bos id a string": ("tokenizer.ggml.bos_token_id", "1", "STRING", None),
    "chat template an array": ("tokenizer.chat_template", ["{{x}}"], "ARRAY", "STRING"),
    "chat template not utf-8": ("tokenizer.chat_template", b"{{ \xff }}", "STRING", None),
    "model an array": ("tokenizer.ggml.model", ["gpt2"], "ARRAY", "STRING"),
    # the same for a SentencePiece vocabulary (tokenizer.model written back)
    "spm tokens a string": ("spm:tokenizer.ggml.tokens", "abcdefgh", "STRING", None),
    "spm tokens not utf-8": ("spm:tokenizer.ggml.tokens", [b"a", b"\xff", *[bytes([99 + i]) for i in range(6)]],
                             "ARRAY", "STRING"),
    "spm scores strings": ("spm:tokenizer.ggml.scores", ["0"] * 8, "ARRAY", "STRING"),
    "spm scores too few": ("spm:tokenizer.ggml.scores", [0.0], "ARRAY", "FLOAT32"),
    "spm scores NaN": ("spm:tokenizer.ggml.scores", [float("nan")] * 8, "ARRAY", "FLOAT32"),
    "spm token types huge": ("spm:tokenizer.ggml.token_type", [2**31 - 1] * 8, "ARRAY", "INT32"),
    "spm token types a string": ("spm:tokenizer.ggml.token_type", "1", "STRING", None),
    "spm bos id a string": ("spm:tokenizer.ggml.bos_token_id", "1", "STRING", None),
}


@pytest.fixture(scope="module")
def bpe_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.cli import migrate_in_process
    from tests.support.tokenizer_files import bpe, hf_llama

    root = tmp_path_factory.mktemp("g2h")
    folder = hf_llama(root / "hf")
    (folder / "tokenizer.json").write_text(bpe())
    done = migrate_in_process("convert", str(folder), str(root / "m.gguf"))
    assert done.returncode == 0, done.stderr
    return root / "m.gguf"


@pytest.mark.parametrize("name", sorted(TOKENIZER_KVS))
def test_hostile_tokenizer_key_values_to_a_folder(bpe_gguf: Path, tmp_path: Path, name: str) -> None:
    """Refused (exit 1 or 2, the promises), or written with no tokenizer.json (a note says why when
    the vocabulary is a gpt2 one), or with one `tokenizers` loads (a bad special id or template is
    left out): never a tokenizer.json built from values of the wrong type, nor a traceback."""
    from tests.support.cli import migrate_in_process

    key, value, vtype, sub = TOKENIZER_KVS[name]
    src = tmp_path / "w" / "m.gguf"
    src.parent.mkdir()
    _retyped(bpe_gguf, src, key, value, vtype, sub)
    out = tmp_path / "w" / "out"
    done = migrate_in_process("convert", str(src), str(out) + "/")
    if done.returncode == 0:
        if (out / "tokenizer.json").exists():
            from tokenizers import Tokenizer

            Tokenizer.from_file(str(out / "tokenizer.json"))
        elif (out / "tokenizer.model").exists():
            import sentencepiece

            sentencepiece.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
        else:
            assert name == "model an array" or "no tokenizer" in done.stdout, done.stdout
        return
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    done = refused(["convert", str(src), str(out) + "/"], tmp_path / "w")
    assert str(src) in done.stderr or key in done.stderr, done.stderr  # names the file or the key

"""A GGUF's SentencePiece vocabulary written back as tokenizer.model (+ tokenizer_config.json), checked by
SentencePiece itself (our tokenizer.model has the original's pieces, scores, types and special ids and
encodes and decodes text as the original) and by transformers (`AutoTokenizer` of the folder encodes as
its own tokenizer of the GGUF). The originals are trained with Llama's normalizer (identity, spaces
kept), which is what llama.cpp applies; a model normalizing otherwise is noted on the way to GGUF."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.models import tiny_llama_rope

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

TEXTS = ["the quick brown fox", "two  spaces   and three", "tabs\tand\nnew lines\n\n",
         "caf\u00e9 \u00e9t\u00e9 42 1234567", "\u4f60\u597d\u4e16\u754c \U0001F600 emoji",
         "cat<sep>dog <sep> fox", "\uff21\uff22\uff23 full width",
         "zzzqqq xyz!?", "  leading spaces", "trailing space "]
LLAMA_NORMALIZER = {"normalization_rule_name": "identity", "remove_extra_whitespaces": False}


@pytest.fixture(scope="module", params=["dummy_prefix", "no_dummy_prefix"])
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(original folder, its GGUF, the folder made back from the GGUF)."""
    from tests.support.gguf_models import sentencepiece_model

    root = tmp_path_factory.mktemp(request.param)
    tiny_llama_rope(vocab_size=300).save_pretrained(root / "hf")
    sentencepiece_model(root / "hf", **LLAMA_NORMALIZER, add_dummy_prefix=request.param == "dummy_prefix")
    for src, dst in (("hf", "m.gguf"), ("m.gguf", "back/")):
        res = migrate_in_process("convert", str(root / src), str(root) + "/" + dst)
        assert res.returncode == 0, res.stdout + res.stderr
    assert "tokenizer.model written" in res.stdout + res.stderr
    return root / "hf", root / "m.gguf", root / "back"


def test_sentencepiece_reads_our_model_as_the_original(converted: tuple[Path, Path, Path]) -> None:
    hf, _, back = converted
    a = spm.SentencePieceProcessor(model_file=str(hf / "tokenizer.model"))
    b = spm.SentencePieceProcessor(model_file=str(back / "tokenizer.model"))
    n = a.get_piece_size()
    assert b.get_piece_size() == n
    for i in range(n):
        assert (b.id_to_piece(i), b.get_score(i)) == (a.id_to_piece(i), a.get_score(i)), i
        assert [f(i) for f in (b.is_unknown, b.is_control, b.is_byte, b.is_unused)] == \
            [f(i) for f in (a.is_unknown, a.is_control, a.is_byte, a.is_unused)], i
    assert (b.unk_id(), b.bos_id(), b.eos_id(), b.pad_id()) == (a.unk_id(), a.bos_id(), a.eos_id(), a.pad_id())
    for text in TEXTS:
        ids = a.encode(text)
        assert b.encode(text) == ids, text
        assert b.encode(text, out_type=str) == a.encode(text, out_type=str), text
        assert b.decode(ids) == a.decode(ids), text


def test_auto_tokenizer_of_the_folder_is_transformers_gguf_tokenizer(converted: tuple[Path, Path, Path]) -> None:
    """With a space prefix, as transformers' own tokenizer of the GGUF; without one (which transformers' GGUF
    tokenizer ignores: it always prefixes a space, where llama.cpp and SentencePiece do not), as SentencePiece."""
    hf, gguf_path, back = converted
    ours = transformers.AutoTokenizer.from_pretrained(back)
    if hf.parent.name.startswith("no_dummy_prefix"):
        sp = spm.SentencePieceProcessor(model_file=str(hf / "tokenizer.model"))
        assert [ours(t, add_special_tokens=False)["input_ids"] for t in TEXTS] == [sp.encode(t) for t in TEXTS]
        return
    theirs = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    for text in [*TEXTS, "<s>the</s> fox"]:
        for special in (False, True):
            ids = theirs(text, add_special_tokens=special)["input_ids"]
            assert ours(text, add_special_tokens=special)["input_ids"] == ids, (text, special)
            assert ours.decode(ids) == theirs.decode(ids), text
    assert (ours.bos_token, ours.eos_token, ours.unk_token) == (theirs.bos_token, theirs.eos_token, theirs.unk_token)


def test_a_normalizing_model_is_noted_on_the_way_to_gguf(tmp_path: Path) -> None:
    """SentencePiece's default normalizer (NFKC, runs of spaces collapsed) is not llama.cpp's: the plan says so."""
    from tests.support.gguf_models import sentencepiece_model

    tiny_llama_rope(vocab_size=300).save_pretrained(tmp_path / "hf")
    sentencepiece_model(tmp_path / "hf")
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(tmp_path / "m.gguf"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "llama.cpp does not apply its normalization table" in res.stdout + res.stderr
    sentencepiece_model(tmp_path / "hf", **LLAMA_NORMALIZER)
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(tmp_path / "m.gguf"), "--overwrite")
    assert "llama.cpp does not apply" not in res.stdout + res.stderr


BYTES = [f"<0x{i:02X}>" for i in range(256)]


@pytest.mark.parametrize(("change", "said"), [
    ({"tokenizer.ggml.scores": None}, "no tokenizer.ggml.scores"),
    ({"tokenizer.ggml.tokens": ["<unk>", "a", "a", *BYTES]}, "repeat"),
    ({"tokenizer.ggml.tokens": ["<unk>", "", "b", *BYTES]}, "empty"),
    ({"tokenizer.ggml.token_type": [1, 1, 1] + [6] * 256}, "one UNKNOWN"),
    ({"tokenizer.ggml.token_type": [2, 2, 1] + [6] * 256}, "one UNKNOWN"),
    ({"tokenizer.ggml.token_type": [2, 1, 6] + [6] * 256}, "is not spelled <0xXX>"),
    ({"tokenizer.ggml.token_type": [2, 1, 0] + [6] * 256}, "token type 0"),
    ({"tokenizer.ggml.scores": [0.0, 0.0]}, "not of one length"),
    ({"tokenizer.ggml.tokens": ["<unk>", "\udcff", "b", *BYTES]}, "not UTF-8"),
])
def test_a_vocabulary_sentencepiece_cannot_load_is_not_written(change: dict[str, object], said: str) -> None:
    from migrator.formats.gguf.spm import sentencepiece_files

    meta: dict[str, object] = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a", "b", *BYTES],
                               "tokenizer.ggml.scores": [0.0, -1.0, -2.0] + [0.0] * 256,
                               "tokenizer.ggml.token_type": [2, 1, 1] + [6] * 256}
    files, notes = sentencepiece_files(meta)  # type: ignore[arg-type]  # lists: what Values' .data hold
    assert set(files) == {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"}
    loaded = spm.SentencePieceProcessor(model_proto=files["tokenizer.model"])
    # a leading U+2581 (no such piece: its UTF-8 bytes), then the pieces, then bytes
    assert loaded.encode("ab\u00e9", out_type=str) == ["<0xE2>", "<0x96>", "<0x81>", "a", "b", "<0xC3>", "<0xA9>"]
    meta.update(change)
    files, notes = sentencepiece_files({k: v for k, v in meta.items() if v is not None})  # type: ignore[arg-type]
    assert files == {} and len(notes) == 1 and said in notes[0], notes

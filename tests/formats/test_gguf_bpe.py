"""Byte-level BPE tokenizers (tokenizer.json: Llama 3, Qwen2, GPT-2 style) <-> GGUF, checked by the
readers people use: gguf-py reads the key/values the `tokenizers` library's own tokenizer gives,
transformers' GGUF tokenizer encodes text exactly as the original tokenizer does, and the
tokenizer.json written back from the GGUF loads in transformers and encodes text the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cli import migrate_in_process
from tests.support.models import tiny_llama_rope

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")
from tests.support.gguf_models import BOS, EOS, TEXTS, bpe_folder  # noqa: E402


@pytest.fixture(scope="module", params=["llama-bpe", "qwen2", "gpt-2"])
def family_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    return request.param, bpe_folder(tmp_path_factory.mktemp("bpe") / "hf", request.param)


@pytest.fixture(scope="module")
def family_gguf(family_folder: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "m.gguf"
    res = migrate_in_process("convert", str(family_folder[1]), str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "tokenizer" not in res.stdout + res.stderr, res.stdout + res.stderr  # no note: a known pre-tokenizer
    return out


def original(folder: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(folder)


def test_key_values_are_the_tokenizer_s(family_folder: tuple[str, Path], family_gguf: Path) -> None:
    family, folder = family_folder
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    n = tok.get_vocab_size()
    fields = gguf.GGUFReader(str(family_gguf)).fields
    assert fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert fields["tokenizer.ggml.pre"].contents() == family
    assert fields["tokenizer.ggml.tokens"].contents() == [tok.id_to_token(i) for i in range(n)] + [
        f"[PAD{i}]" for i in range(n, n + 3)]
    added = {t.content: t for t in tok.get_added_tokens_decoder().values()}
    expected_types = [(3 if added[t].special else 4) if t in added else 1 for t in map(tok.id_to_token, range(n))]
    assert fields["tokenizer.ggml.token_type"].contents() == [*expected_types, 5, 5, 5]
    merges = json.loads(tok.to_str())["model"]["merges"]
    assert fields["tokenizer.ggml.merges"].contents() == [" ".join(m) for m in merges]
    assert fields["tokenizer.ggml.bos_token_id"].contents() == tok.token_to_id(BOS)
    assert fields["tokenizer.ggml.eos_token_id"].contents() == tok.token_to_id(EOS)
    assert fields["tokenizer.ggml.add_bos_token"].contents() is True
    assert fields["tokenizer.ggml.add_eos_token"].contents() is False


def test_transformers_tokenizes_our_gguf_like_the_original(family_folder: tuple[str, Path], family_gguf: Path) -> None:
    want = original(family_folder[1])
    got = transformers.AutoTokenizer.from_pretrained(family_gguf.parent, gguf_file=family_gguf.name)
    for text in TEXTS:
        for special in (False, True):
            assert got(text, add_special_tokens=special)["input_ids"] == want(text, add_special_tokens=special)[
                "input_ids"], (text, special)


def test_gguf_to_hf_folder_writes_a_tokenizer_json(family_folder: tuple[str, Path], family_gguf: Path,
                                                   tmp_path: Path) -> None:
    """GGUF -> folder: the tokenizer.json written loads in transformers and encodes as the original."""
    res = migrate_in_process("convert", str(family_gguf), str(tmp_path / "back") + "/")
    assert res.returncode == 0, res.stdout + res.stderr
    want = original(family_folder[1])
    back = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    for text in TEXTS:
        for special in (False, True):
            assert back(text, add_special_tokens=special)["input_ids"] == want(text, add_special_tokens=special)[
                "input_ids"], (text, special)
    assert back.bos_token == BOS and back.eos_token == EOS
    assert back.decode(want(TEXTS[3])["input_ids"], skip_special_tokens=True) == TEXTS[3]


def test_unknown_pre_tokenizer_is_written_default_with_a_note(tmp_path: Path) -> None:
    folder = bpe_folder(tmp_path / "hf", "qwen2")
    data = json.loads((folder / "tokenizer.json").read_text())
    data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\s+|\p{N}+|[^\s\p{L}\p{N}]+"
    (folder / "tokenizer.json").write_text(json.dumps(data))
    res = migrate_in_process("convert", str(folder), str(tmp_path / "m.gguf"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "pre-tokenizer is not one migrator recognises" in res.stdout + res.stderr
    assert gguf.GGUFReader(str(tmp_path / "m.gguf")).fields["tokenizer.ggml.pre"].contents() == "default"
    # the user's name for it wins
    res = migrate_in_process("convert", str(folder), str(tmp_path / "n.gguf"), "--metadata",
                             "tokenizer.ggml.pre=qwen2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert gguf.GGUFReader(str(tmp_path / "n.gguf")).fields["tokenizer.ggml.pre"].contents() == "qwen2"
    # and back: a 'default' pre-tokenizer has no tokenizer.json spelling, which the plan says
    res = migrate_in_process("convert", str(tmp_path / "m.gguf"), str(tmp_path / "back") + "/")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no tokenizer.json written" in res.stdout + res.stderr
    assert not (tmp_path / "back" / "tokenizer.json").exists()


def test_a_wordpiece_tokenizer_json_is_not_converted(tmp_path: Path) -> None:
    """A tokenizer.json that is not byte-level BPE: the weights are written and the plan says llama.cpp
    needs a tokenizer."""
    from tokenizers import Tokenizer, models

    folder = tmp_path / "hf"
    tiny_llama_rope(vocab_size=8).save_pretrained(folder)
    Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))
    res = migrate_in_process("convert", str(folder), str(tmp_path / "m.gguf"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "llama.cpp needs a tokenizer" in res.stdout + res.stderr
    assert "tokenizer.ggml.model" not in gguf.GGUFReader(str(tmp_path / "m.gguf")).fields


@pytest.mark.parametrize("content, message", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("[" * 100 + "]" * 100, "nested too deeply"),
    ('{"model": {"type": "BPE", "vocab": {"a": 99999999999}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}}',
     "ids are integers below"),
    ('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a b", "c"]]}, "pre_tokenizer": {"type": "ByteLevel"}}',
     "is not two tokens"),
    ('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}, '
     '"added_tokens": [{"id": -1, "content": "x"}]}', "added token without a valid id"),
    ("not json", "is not JSON"),
])
def test_hostile_tokenizer_json_is_a_clean_error(tmp_path: Path, content: str, message: str) -> None:
    from migrator.core.errors import FormatError
    from migrator.formats.gguf.bpe import bpe_metadata

    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    with pytest.raises(FormatError, match=message):
        bpe_metadata(path)


def test_special_ids_fall_back_to_config_json(tmp_path: Path) -> None:
    """Without token texts in tokenizer_config.json, BOS/EOS come from config.json's ids."""
    from migrator.formats.gguf.bpe import bpe_metadata

    folder = bpe_folder(tmp_path / "hf", "gpt-2")
    (folder / "tokenizer_config.json").unlink()
    meta, _ = bpe_metadata(folder / "tokenizer.json")
    config = json.loads((folder / "config.json").read_text())
    assert meta["tokenizer.ggml.bos_token_id"].data == config["bos_token_id"]
    assert meta["tokenizer.ggml.eos_token_id"].data == config["eos_token_id"]
    assert len(meta["tokenizer.ggml.tokens"].data) == config["vocab_size"]
    assert np.asarray(meta["tokenizer.ggml.token_type"].data)[-1] == 5


def test_pre_tokenizer_table_is_transformers_s() -> None:
    """The split regex we recognise for each name is the one transformers' GGUF loader rebuilds for that
    name (its copy of each family's tokenizer.json regex), so a file we name loads back splitting alike."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    from migrator.formats.gguf.bpe import PRE_TOKENIZERS

    assert {name: regex for name, (regex, _) in PRE_TOKENIZERS.items()} == {
        name: GGUF_PRE_TOKENIZER_SPLITS[name] for name in PRE_TOKENIZERS}

"""Companion files that make an output folder loadable (issue 25 items 5 and 6): `--copy-from` /
`target.copy_from` bring config.json and the tokenizer from another folder (a .bpk source has
none beside it); a cast rewrites the copied config.json's dtype so `from_pretrained` builds the model
in the dtype written; a resharded index carries transformers' `total_parameters` and `total_size`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process as migrate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.models import tiny_bert_folder

    return tiny_bert_folder(tmp_path_factory.mktemp("hf") / "bert")


def test_bpk_to_hf_folder_with_companions_from_another_folder(hf_model: Path, tmp_path: Path) -> None:
    bpk = tmp_path / "bert.bpk"
    assert migrate("convert", str(hf_model) + "/", str(bpk)).returncode == 0
    out = tmp_path / "out"
    r = migrate("convert", str(bpk), str(out) + "/", "--copy", "config.json", "--copy-from", str(hf_model))
    assert r.returncode == 0, r.stderr
    got = transformers.BertModel.from_pretrained(out)
    want = transformers.BertModel.from_pretrained(hf_model)
    for (k, a), (_, b) in zip(got.state_dict().items(), want.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_copy_from_in_a_recipe_and_refusals(hf_model: Path, tmp_path: Path) -> None:
    bpk = tmp_path / "bert.bpk"
    assert migrate("convert", str(hf_model) + "/", str(bpk)).returncode == 0
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: bert.bpk}}\n"
                      f"target: {{path: out/, copy: [config.json], copy_from: {hf_model}}}\n")
    r = migrate("run", str(recipe), "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "out" / "config.json").read_bytes() == (hf_model / "config.json").read_bytes()
    # copying from the folder being replaced is refused, and the target survives
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    recipe.write_text("version: 1\nsource: {path: bert.bpk}\n"
                      "target: {path: out/, copy: [config.json], copy_from: out, overwrite: true}\n")
    r = migrate("run", str(recipe), "--no-progress")
    assert r.returncode != 0 and "is the target folder or inside it" in r.stdout + r.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    recipe.write_text("version: 1\nsource: {path: bert.bpk}\ntarget: {path: out2/, copy_from: x}\n")
    r = migrate("validate", str(recipe))
    assert r.returncode == 2 and "there is no copy" in r.stdout + r.stderr


def test_copy_from_alone_copies_the_usual_companions(tmp_path: Path) -> None:
    """`--copy-from DIR` alone (as the README and the DeepSpeed example use it): the folder's config,
    generation config, tokenizer files and chat template; transformers loads the model, its generation
    config and its tokenizer from the output as from the original folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.support.models import tiny_llama_rope

    hf = tmp_path / "hf"
    model = tiny_llama_rope(vocab_size=64)
    model.generation_config.temperature, model.generation_config.do_sample = 0.5, True
    model.save_pretrained(hf)
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "the", "cat", "sat"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                               eos_token="</s>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tok.save_pretrained(hf)
    (hf / "notes.txt").write_text("not a companion")
    bpk = tmp_path / "llama.bpk"
    assert migrate("convert", str(hf) + "/", str(bpk)).returncode == 0
    out = tmp_path / "out"
    r = migrate("convert", str(bpk), str(out) + "/", "--copy-from", str(hf))
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (out / "notes.txt").exists()
    got, want = (transformers.LlamaForCausalLM.from_pretrained(p) for p in (out, hf))
    for (k, a), (_, b) in zip(got.state_dict().items(), want.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert got.generation_config.to_dict() == want.generation_config.to_dict()
    got_tok, want_tok = (transformers.AutoTokenizer.from_pretrained(p) for p in (out, hf))
    assert got_tok("the cat sat")["input_ids"] == want_tok("the cat sat")["input_ids"] == [3, 4, 5]
    chat = [{"role": "user", "content": "the cat"}]
    assert got_tok.apply_chat_template(chat, tokenize=False) == want_tok.apply_chat_template(chat, tokenize=False)
    # a file target has no room for companions: refused as --copy is, not ignored
    r = migrate("convert", str(bpk), str(tmp_path / "o2"), "--copy-from", str(hf))
    assert r.returncode == 2 and "--copy-from needs a folder target" in r.stderr, r.stdout + r.stderr
    assert list(tmp_path.glob("o2*")) == []


@pytest.mark.parametrize(("dtype", "torch_dtype"), [("BF16", torch.bfloat16), ("F16", torch.float16)])
def test_cast_rewrites_the_config_dtype(hf_model: Path, tmp_path: Path, dtype: str, torch_dtype: torch.dtype) -> None:
    out = tmp_path / "cast"
    r = migrate("convert", str(hf_model) + "/", str(out) + "/", "--dtype", dtype, "--copy", "config.json")
    assert r.returncode == 0, r.stderr
    name = str(torch_dtype).removeprefix("torch.")
    assert f"it is written saying {name}" in r.stdout
    assert json.loads((out / "config.json").read_text())["dtype"] == name
    got = transformers.BertModel.from_pretrained(out, dtype="auto")
    assert got.dtype == torch_dtype
    want = transformers.BertModel.from_pretrained(hf_model)
    for (k, a), (_, b) in zip(got.state_dict().items(), want.state_dict().items(), strict=True):
        assert torch.equal(a, b.to(torch_dtype)), k
    # unchanged dtype: the config is copied byte for byte, no note
    r = migrate("convert", str(hf_model) + "/", str(tmp_path / "same") + "/", "--copy", "config.json")
    assert "written saying" not in r.stdout
    assert (tmp_path / "same" / "config.json").read_bytes() == (hf_model / "config.json").read_bytes()


def test_reshard_index_metadata_matches_save_pretrained(hf_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "reshard"
    r = migrate("convert", str(hf_model) + "/", str(out) + "/", "--max-shard-size", "10KB")
    assert r.returncode == 0, r.stderr
    ours = json.loads((out / "model.safetensors.index.json").read_text())
    reference = tmp_path / "reference"
    transformers.BertModel.from_pretrained(hf_model).save_pretrained(reference, max_shard_size="10KB")
    theirs = json.loads((reference / "model.safetensors.index.json").read_text())
    assert ours["metadata"] == theirs["metadata"]
    assert set(ours["weight_map"]) == set(theirs["weight_map"])

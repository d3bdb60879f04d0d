"""Vocabulary growth: `migrate convert MODEL OUT/ --add-tokens FILE` and a recipe's `add_tokens`, compared
with transformers: the model resized by `resize_token_embeddings(n, mean_resizing=False)` with its new rows
then set to the mean of the old rows explicitly (untied and tied heads), and `AutoTokenizer.from_pretrained`
of the output encoding text as the original tokenizer does after `add_tokens`. Tokens already present,
listed twice, a padded embedding and a single-file target are one-line errors with nothing written."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

VOCAB = 64
NEW = ["<tool>", "</tool>", "zz top", "hello"]  # "hello" is not in the vocabulary below
TEXT = "w3 <tool> w7 zz top w12 </tool> hello w1"


def _model(tmp_path: Path, name: str, tied: bool, vocab_rows: int = VOCAB) -> Path:
    cfg = transformers.LlamaConfig(vocab_size=vocab_rows, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=tied)
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(cfg).eval()
    folder = tmp_path / name
    model.save_pretrained(folder)
    words = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(VOCAB - 3))]
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")
    fast.save_pretrained(folder)
    return folder


def _oracle(folder: Path, tokens: list[str]) -> tuple[object, object]:
    """transformers' own growth: add_tokens, resize_token_embeddings without its random init, the new rows
    set to the mean of the old ones."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.add_tokens(tokens)
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():
        for layer in {id(m): m for m in (model.get_input_embeddings(), model.get_output_embeddings())}.values():
            layer.weight[old:] = layer.weight[:old].mean(dim=0)
    return model, tok


def _check(out: Path, folder: Path, tokens: list[str], tied: bool) -> None:
    want_model, want_tok = _oracle(folder, tokens)
    got_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert len(got_tok) == len(want_tok) == VOCAB + len(tokens)
    assert got_tok(TEXT)["input_ids"] == want_tok(TEXT)["input_ids"]
    assert got_tok.decode(got_tok(TEXT)["input_ids"]) == want_tok.decode(want_tok(TEXT)["input_ids"])
    got = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    assert got.config.vocab_size == VOCAB + len(tokens)
    assert got.config.tie_word_embeddings is tied
    for a, b in ((got.get_input_embeddings(), want_model.get_input_embeddings()),
                 (got.get_output_embeddings(), want_model.get_output_embeddings())):
        torch.testing.assert_close(a.weight, b.weight, rtol=0, atol=1e-6)
    ids = torch.tensor([want_tok(TEXT)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(got(ids).logits, want_model(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
def test_convert_add_tokens_equals_transformers(tmp_path: Path, tied: bool) -> None:
    folder = _model(tmp_path, "model", tied)
    (tmp_path / "new.txt").write_text("\n".join(NEW[:2]) + "\n\n" + NEW[3] + "\n", encoding="utf-8")
    out = tmp_path / "out"
    p = migrate_in_process("convert", f"{folder}/", f"{out}/", "--add-tokens", str(tmp_path / "new.txt"))
    assert p.returncode == 0, p.stderr
    tokens = [NEW[0], NEW[1], NEW[3]]
    _check(out, folder, tokens, tied)
    assert f"add_tokens: 3 tokens added as ids {VOCAB}..{VOCAB + 2}" in p.stdout + p.stderr
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as f:  # a tied head stays tied: not written
        names = list(f.keys())
    assert ("lm_head.weight" in names) is not tied


def test_a_recipe_adds_tokens_from_a_json_list(tmp_path: Path) -> None:
    folder = _model(tmp_path, "model", False)
    (tmp_path / "new.json").write_text(json.dumps(NEW), encoding="utf-8")  # "zz top" has a space: JSON
    (tmp_path / "r.yaml").write_text(textwrap.dedent("""\
        version: 1
        source: {path: model/}
        add_tokens: {file: new.json}
        target: {path: out/, copy: [config.json, 'tokenizer*']}
    """), encoding="utf-8")
    p = migrate_in_process("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 0, p.stderr
    _check(tmp_path / "out", folder, NEW, False)


def _refused(tmp_path: Path, args: list[str], *words: str) -> None:
    p = migrate_in_process(*args)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    problems = [ln for ln in p.stderr.splitlines() if ln.startswith(("error:", "migrate: error:"))]
    assert len(problems) == 1, p.stderr
    for w in words:
        assert w in problems[0], problems[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.safetensors").exists()


def test_bad_token_lists_are_one_line_errors(tmp_path: Path) -> None:
    folder = _model(tmp_path, "model", False)
    tokens = tmp_path / "new.txt"
    tokens.write_text("<tool>\nw5\n", encoding="utf-8")
    _refused(tmp_path, ["convert", f"{folder}/", f"{tmp_path / 'out'}/", "--add-tokens", str(tokens)],
             "add_tokens: 'w5' is already token 8 of", "tokenizer.json")
    tokens.write_text("<tool>\n<tool>\n", encoding="utf-8")
    _refused(tmp_path, ["convert", f"{folder}/", f"{tmp_path / 'out'}/", "--add-tokens", str(tokens)],
             "lists '<tool>' twice")
    tokens.write_text("<tool>\n", encoding="utf-8")
    _refused(tmp_path, ["convert", f"{folder}/", str(tmp_path / "out.safetensors"), "--add-tokens", str(tokens)],
             "add_tokens writes the tokenizer files beside the weights: write a folder target")
    padded = _model(tmp_path, "padded", False, vocab_rows=VOCAB + 8)
    _refused(tmp_path, ["convert", f"{padded}/", f"{tmp_path / 'out'}/", "--add-tokens", str(tokens)],
             "'model.embed_tokens.weight' has 72 rows but the tokenizer in", "has 64 tokens")
    # One byte over the limit: refused whole, never read cut (its last token would be half-written).
    from migrator.files.model_config import MAX_CONFIG_BYTES
    line = "<t" + "x" * 97 + ">\n"
    tokens.write_text(line * (MAX_CONFIG_BYTES // len(line) + 1), encoding="utf-8")
    _refused(tmp_path, ["convert", f"{folder}/", f"{tmp_path / 'out'}/", "--add-tokens", str(tokens)],
             "add_tokens:", f"is over {MAX_CONFIG_BYTES} bytes")


def test_a_transformers_4_tokenizer_config_gets_its_decoder_entries(tmp_path: Path) -> None:
    """transformers 4 wrote every added token into tokenizer_config.json's added_tokens_decoder too; the
    new tokens go there with their ids, and transformers still encodes as after add_tokens."""
    folder = _model(tmp_path, "model", False)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["added_tokens_decoder"] = {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                               "single_word": False, "special": True}
                                      for i, c in enumerate(["<unk>", "<s>", "</s>"])}
    config_path.write_text(json.dumps(config))
    (tmp_path / "new.txt").write_text("<tool>\n</tool>\n", encoding="utf-8")
    out = tmp_path / "out"
    p = migrate_in_process("convert", f"{folder}/", f"{out}/", "--add-tokens", str(tmp_path / "new.txt"))
    assert p.returncode == 0, p.stderr
    decoder = json.loads((out / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert decoder[str(VOCAB)]["content"] == "<tool>" and decoder[str(VOCAB + 1)]["content"] == "</tool>"
    assert decoder[str(VOCAB)]["special"] is False and decoder[str(VOCAB)]["normalized"] is True
    _check(out, folder, ["<tool>", "</tool>"], False)

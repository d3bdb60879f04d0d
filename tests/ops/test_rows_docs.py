"""Every block of docs/rows-and-experts.md (`<!-- tested: NAME -->` before it) run as written, in a folder
holding the tiny transformers models it names, and its result compared with transformers or torch: an
untied head and grouped-query attention made multi-head give the original model's logits; the grown
vocabulary equals transformers' add_tokens + resize_token_embeddings(mean_resizing=False) + the explicit
mean; the pruned Mixtral equals torch's slicing; the extracted expert a Mistral given that expert's MLP;
the upcycled model the dense one's logits."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
st = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "rows-and-experts.md"
BLOCKS = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
    r"<!-- tested: (\S+) -->\n```(yaml|sh)\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)}
TOKENS = torch.tensor([[3, 17, 5, 60, 22, 9, 41, 0]])
SMALL = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def _logits(model: object, ids: object = TOKENS) -> object:
    with torch.no_grad():
        return model(ids).logits  # type: ignore[operator]


def _save(model: object, folder: Path, tokenizer: bool = False) -> None:
    model.save_pretrained(folder)  # type: ignore[attr-defined]
    if tokenizer:
        words = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(61))]
        tk = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
        tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>").save_pretrained(folder)


def _llama(**changes: object) -> object:
    torch.manual_seed(5)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**SMALL, **changes})).eval()


def _run_block(name: str, where: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kind, text = BLOCKS[name]
    monkeypatch.chdir(where)
    if kind == "yaml":
        (where / f"{name}.yaml").write_text(text, encoding="utf-8")
        args = ["run", f"{name}.yaml", "--no-progress"]
    else:
        words = shlex.split(text)
        assert words[0] == "migrate"
        args = [str(REPO / w) if w.startswith("recipes/") else w for w in words[1:]] + ["--no-progress"]
    p = migrate_in_process(*args)
    assert p.returncode == 0, p.stderr


def test_every_block_is_tested() -> None:
    assert sorted(BLOCKS) == sorted(["untie", "gqa-to-mha", "add-tokens-cli", "add-tokens-recipe", "prune", "extract",
                                     "upcycle"])


def test_untie(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tied = _llama(tie_word_embeddings=True)
    _save(tied, tmp_path / "tied")
    _run_block("untie", tmp_path, monkeypatch)
    out = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "untied").eval()
    assert out.config.tie_word_embeddings is False
    assert out.lm_head.weight.data_ptr() != out.model.embed_tokens.weight.data_ptr()
    assert "lm_head.weight" in st.load_file(tmp_path / "untied" / "model.safetensors")
    torch.testing.assert_close(_logits(out), _logits(tied), rtol=0, atol=1e-6)


def test_gqa_to_mha(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gqa = _llama(tie_word_embeddings=False)
    _save(gqa, tmp_path / "gqa")
    _run_block("gqa-to-mha", tmp_path, monkeypatch)
    mha = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "mha").eval()
    assert mha.config.num_key_value_heads == 4
    assert mha.model.layers[0].self_attn.k_proj.weight.shape == (16, 16)
    torch.testing.assert_close(_logits(mha), _logits(gqa), rtol=0, atol=1e-5)


def _check_grown(folder: Path, out: Path, new: list[str]) -> None:
    want_tok = transformers.AutoTokenizer.from_pretrained(folder)
    want_tok.add_tokens(new)
    want = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    old = want.get_input_embeddings().weight.shape[0]
    want.resize_token_embeddings(len(want_tok), mean_resizing=False)
    with torch.no_grad():
        for layer in (want.get_input_embeddings(), want.get_output_embeddings()):
            layer.weight[old:] = layer.weight[:old].mean(dim=0)
    got_tok = transformers.AutoTokenizer.from_pretrained(out)
    text = f"w1 {' w2 '.join(new)} w3"
    assert got_tok(text)["input_ids"] == want_tok(text)["input_ids"]
    got = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    assert got.config.vocab_size == len(want_tok)
    ids = torch.tensor([want_tok(text)["input_ids"]])
    torch.testing.assert_close(_logits(got, ids), _logits(want, ids), rtol=0, atol=1e-5)


def test_add_tokens_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _save(_llama(tie_word_embeddings=False), tmp_path / "model", tokenizer=True)
    (tmp_path / "new-tokens.txt").write_text("<tool_call>\n</tool_call>\n<think>\n", encoding="utf-8")
    _run_block("add-tokens-cli", tmp_path, monkeypatch)
    _check_grown(tmp_path / "model", tmp_path / "grown", ["<tool_call>", "</tool_call>", "<think>"])


def test_add_tokens_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _save(_llama(tie_word_embeddings=True), tmp_path / "model", tokenizer=True)
    _run_block("add-tokens-recipe", tmp_path, monkeypatch)
    _check_grown(tmp_path / "model", tmp_path / "grown-recipe", ["<tool_call>", "</tool_call>"])


def _mixtral(folder: Path) -> object:
    torch.manual_seed(6)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **SMALL, num_local_experts=4, num_experts_per_tok=2)).eval()
    model.save_pretrained(folder)
    return model


def test_prune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _mixtral(tmp_path / "mixtral")
    _run_block("prune", tmp_path, monkeypatch)
    src = st.load_file(tmp_path / "mixtral" / "model.safetensors")
    got = st.load_file(tmp_path / "pruned" / "model.safetensors")
    for layer in range(2):
        p = f"model.layers.{layer}.block_sparse_moe."
        assert torch.equal(got[p + "gate.weight"], src[p + "gate.weight"][[0, 2]])
        for new, old in ((0, 0), (1, 2)):
            for w in ("w1", "w2", "w3"):
                assert torch.equal(got[f"{p}experts.{new}.{w}.weight"], src[f"{p}experts.{old}.{w}.weight"])
    assert not any(".experts.2." in n or ".experts.3." in n for n in got)
    assert json.loads((tmp_path / "pruned" / "config.json").read_text())["num_local_experts"] == 2


def test_extract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mixtral = _mixtral(tmp_path / "mixtral")
    _run_block("extract", tmp_path, monkeypatch)
    src = st.load_file(tmp_path / "mixtral" / "model.safetensors")
    ref = transformers.MistralForCausalLM(transformers.MistralConfig(
        **SMALL, rms_norm_eps=mixtral.config.rms_norm_eps, rope_theta=mixtral.config.rope_parameters["rope_theta"],
        tie_word_embeddings=False)).eval()
    mlp = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    ref.load_state_dict({k: src[k] if ".mlp." not in k else src[
        f"model.layers.{k.split('.')[2]}.block_sparse_moe.experts.1.{mlp[k.split('.')[4]]}.weight"]
        for k in ref.state_dict()})
    dense = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense").eval()
    assert type(dense).__name__ == "MistralForCausalLM"
    torch.testing.assert_close(_logits(dense), _logits(ref), rtol=0, atol=1e-5)


def test_upcycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(7)
    mistral = transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, tie_word_embeddings=False)).eval()
    mistral.save_pretrained(tmp_path / "mistral")
    _run_block("upcycle", tmp_path, monkeypatch)
    moe = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "moe").eval()
    assert type(moe).__name__ == "MixtralForCausalLM" and moe.config.num_local_experts == 4
    torch.testing.assert_close(_logits(moe), _logits(mistral), rtol=0, atol=1e-5)

"""Hugging Face Llama folders -> GGUF, checked by the readers people use: transformers loads the file
back with every parameter `torch.equal` to the original (names, q/k permute and architecture
metadata), gguf-py reads the tokenizer key/values SentencePiece gives, and transformers' GGUF
tokenizer encodes text as the SentencePiece model does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import migrate_in_process
from tests.support.models import tiny_llama_rope as tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
spm = pytest.importorskip("sentencepiece")
from tests.support.gguf_models import TEXT, sentencepiece_model  # noqa: E402


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama") / "hf"
    model = tiny_llama(vocab_size=300)
    model.save_pretrained(folder)
    sentencepiece_model(folder)
    return folder


def test_llama_folder_to_gguf_loads_in_transformers(hf_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    res = migrate_in_process("convert", str(hf_folder), str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    original = transformers.LlamaForCausalLM.from_pretrained(hf_folder)
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path, gguf_file=out.name)
    a, b = original.state_dict(), back.state_dict()
    assert set(a) == set(b)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings", "rms_norm_eps", "vocab_size"):
        assert getattr(back.config, key) == pytest.approx(getattr(original.config, key), rel=1e-6), key
    assert back.config.rope_parameters["rope_theta"] == original.config.rope_parameters["rope_theta"] == 50000.0
    names = [t.name for t in gguf.GGUFReader(str(out)).tensors]
    assert "blk.1.attn_q.weight" in names and "token_embd.weight" in names and "output_norm.weight" in names


def test_quantized_llama_gguf_loads(hf_folder: Path, tmp_path: Path) -> None:
    """--quantize Q8_0: 2-D weights Q8_0 (bytes = gguf-py's quantize of the permuted weight), norms F32."""
    out = tmp_path / "q.gguf"
    res = migrate_in_process("convert", str(hf_folder), str(out), "--quantize", "Q8_0")
    assert res.returncode == 0, res.stdout + res.stderr
    r = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.ffn_up.weight"] == "Q8_0" and types["blk.0.attn_norm.weight"] == "F32"
    original = transformers.LlamaForCausalLM.from_pretrained(hf_folder)
    up = original.model.layers[0].mlp.up_proj.weight.detach().numpy()
    raw = next(t for t in r.tensors if t.name == "blk.0.ffn_up.weight")
    assert np.asarray(raw.data).tobytes() == gguf.quants.quantize(up, gguf.GGMLQuantizationType.Q8_0).tobytes()
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path, gguf_file=out.name)
    assert torch.equal(back.model.norm.weight, original.model.norm.weight)


def test_tokenizer_key_values_are_sentencepiece_s(hf_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.gguf"
    assert migrate_in_process("convert", str(hf_folder), str(out)).returncode == 0
    sp = spm.SentencePieceProcessor(model_file=str(hf_folder / "tokenizer.model"))
    fields = gguf.GGUFReader(str(out)).fields
    n = sp.get_piece_size()
    assert fields["tokenizer.ggml.model"].contents() == "llama"
    assert fields["tokenizer.ggml.tokens"].contents() == [sp.id_to_piece(i) for i in range(n)]
    assert np.array_equal(np.float32(fields["tokenizer.ggml.scores"].contents()),
                          np.float32([sp.get_score(i) for i in range(n)]))

    def kind(i: int) -> int:  # llama.cpp's token types, from SentencePiece's flags
        return (2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                else 5 if sp.is_unused(i) else 4 if sp.id_to_piece(i) == "<sep>" else 1)

    assert fields["tokenizer.ggml.token_type"].contents() == [kind(i) for i in range(n)]
    assert fields["tokenizer.ggml.bos_token_id"].contents() == sp.bos_id() == 1
    assert fields["tokenizer.ggml.eos_token_id"].contents() == sp.eos_id() == 2
    assert fields["tokenizer.ggml.unknown_token_id"].contents() == sp.unk_id()
    assert fields["tokenizer.ggml.add_bos_token"].contents() is True


def test_transformers_tokenizes_our_gguf_like_sentencepiece(hf_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.gguf"
    assert migrate_in_process("convert", str(hf_folder), str(out)).returncode == 0
    sp = spm.SentencePieceProcessor(model_file=str(hf_folder / "tokenizer.model"))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)
    for text in (TEXT, "quick dogs jump", "zebra \u00e9t\u00e9 42"):
        assert tok(text, add_special_tokens=False)["input_ids"] == sp.encode(text), text


def test_bpe_folder_without_sentencepiece_warns(hf_folder: Path, tmp_path: Path) -> None:
    """Without tokenizer.model the weights are written and the plan says llama.cpp needs a tokenizer."""
    folder = tmp_path / "hf"
    folder.mkdir()
    for f in hf_folder.iterdir():
        if f.name != "tokenizer.model":
            (folder / f.name).write_bytes(f.read_bytes())
    res = migrate_in_process("convert", str(folder), str(tmp_path / "w.gguf"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "tokenizer" in res.stdout + res.stderr


def test_llama_gguf_to_hf_folder(hf_folder: Path, tmp_path: Path) -> None:
    """GGUF -> folder: from_pretrained of the folder (config.json made from the key/values) equals what
    transformers reads from the same GGUF, and the original model."""
    gguf_path = tmp_path / "m.gguf"
    assert migrate_in_process("convert", str(hf_folder), str(gguf_path)).returncode == 0
    res = migrate_in_process("convert", str(gguf_path), str(tmp_path / "back"), "--max-shard-size", "5GB")
    assert res.returncode == 0, res.stdout + res.stderr
    folder = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "back")
    from_gguf = transformers.LlamaForCausalLM.from_pretrained(tmp_path, gguf_file=gguf_path.name)
    original = transformers.LlamaForCausalLM.from_pretrained(hf_folder)
    a, b, c = folder.state_dict(), from_gguf.state_dict(), original.state_dict()
    assert set(a) == set(b) == set(c)
    assert [k for k in a if not (torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]))] == []
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings", "rms_norm_eps", "vocab_size", "bos_token_id", "eos_token_id",
                "tie_word_embeddings"):
        assert getattr(folder.config, key) == getattr(original.config, key), key
    assert folder.config.rope_parameters["rope_theta"] == 50000.0
    tokens = torch.tensor([[1, 5, 17, 42, 7]])
    assert torch.equal(folder(tokens).logits, original(tokens).logits)


def test_hf_config_needs_a_folder_target(tmp_path: Path) -> None:
    import migrator
    from migrator.plan.build import build_plan
    from migrator.recipe.convert import build_recipe

    src = tmp_path / "a.gguf"
    migrator.save({"w": np.ones((2, 32), np.float32)}, src, metadata={"general.architecture": "llama"})
    recipe = build_recipe(src, tmp_path / "b.safetensors")
    recipe = recipe.model_copy(update={"target": recipe.target.model_copy(update={"hf_config": True})})
    with build_plan(recipe, tmp_path) as plan:
        assert any("hf_config" in f for f in plan.fatal), plan.fatal


def test_head_dim_other_than_hidden_over_heads(tmp_path: Path) -> None:
    """head_dim 32 with hidden 64 and 4 heads: the key/value lengths are written and transformers reads
    the model back equal."""
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=64)
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(tmp_path / "hf")
    out = tmp_path / "m.gguf"
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    fields = gguf.GGUFReader(str(out)).fields
    assert fields["llama.attention.key_length"].contents() == fields["llama.attention.value_length"].contents() == 32
    original = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path, gguf_file=out.name)
    a, b = original.state_dict(), back.state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []

"""Qwen2 and Phi-3 Hugging Face folders <-> GGUF, checked by transformers' GGUF loader: it reads our
file back with every parameter `torch.equal` to the original (names, biases, no q/k permute:
llama.cpp rotates these as GPT-NeoX does), and the folder we make back from the GGUF equals what it
reads from the same file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_support import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")


def tiny_qwen2(vocab_size: int = 96, tied: bool = False) -> Any:
    """A 2-layer Qwen2ForCausalLM (q/k/v biases, grouped-query attention), seeded; biases drawn non-zero."""
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   rope_theta=50000.0, rms_norm_eps=1e-5, tie_word_embeddings=tied,
                                   bos_token_id=1, eos_token_id=2)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape) * 0.5)
    return model


def tiny_phi3(vocab_size: int = 32064) -> Any:
    """A 2-layer Phi3ForCausalLM (fused qkv and gate_up projections), seeded. Phi-3's vocabulary size: a
    config.json without pad_token_id (ours or transformers' from a GGUF) gets Phi3Config's 32000."""
    torch.manual_seed(0)
    cfg = transformers.Phi3Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                  original_max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5,
                                  sliding_window=None, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.Phi3ForCausalLM(cfg).eval()


MODELS = {"qwen2": tiny_qwen2, "qwen2-tied": lambda: tiny_qwen2(tied=True), "phi3": tiny_phi3}
CLASSES = {"qwen2": "Qwen2ForCausalLM", "qwen2-tied": "Qwen2ForCausalLM", "phi3": "Phi3ForCausalLM"}


@pytest.fixture(scope="module", params=sorted(MODELS))
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    MODELS[request.param]().save_pretrained(folder)
    out = folder.parent / "m.gguf"
    res = migrate_in_process("convert", str(folder), str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    return request.param, folder, out


def _load(kind: str, folder: Path, gguf_file: str | None = None) -> Any:
    cls = getattr(transformers, CLASSES[kind])
    return cls.from_pretrained(folder, gguf_file=gguf_file) if gguf_file else cls.from_pretrained(folder)


def test_transformers_reads_our_gguf_back_equal(converted: tuple[str, Path, Path]) -> None:
    kind, folder, out = converted
    original, back = _load(kind, folder), _load(kind, out.parent, out.name)
    a, b = original.state_dict(), back.state_dict()
    assert set(a) == set(b)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert type(back).__name__ == CLASSES[kind]
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings", "rms_norm_eps", "vocab_size", "tie_word_embeddings"):
        assert getattr(back.config, key) == pytest.approx(getattr(original.config, key), rel=1e-6), key
    arch = kind.split("-")[0]
    r = gguf.GGUFReader(str(out))
    assert r.fields["general.architecture"].contents() == arch
    tensors = {t.name: np.asarray(t.data) for t in r.tensors}
    if arch == "qwen2":  # biases written, q as Hugging Face stores it (no permute)
        assert np.array_equal(tensors["blk.0.attn_q.bias"], a["model.layers.0.self_attn.q_proj.bias"].numpy())
        assert np.array_equal(tensors["blk.1.attn_k.weight"], a["model.layers.1.self_attn.k_proj.weight"].numpy())
    else:  # llama.cpp refuses the file unless these are UINT32
        field = r.fields["phi3.rope.scaling.original_context_length"]
        assert field.types == [gguf.GGUFValueType.UINT32] and field.contents() == 128
        assert np.array_equal(tensors["blk.0.attn_qkv.weight"], a["model.layers.0.self_attn.qkv_proj.weight"].numpy())
        assert np.array_equal(tensors["blk.1.ffn_up.weight"], a["model.layers.1.mlp.gate_up_proj.weight"].numpy())
    assert ("output.weight" in tensors) == (kind != "qwen2-tied")


def test_gguf_to_folder_equals_what_transformers_reads(converted: tuple[str, Path, Path], tmp_path: Path) -> None:
    kind, folder, out = converted
    res = migrate_in_process("convert", str(out), str(tmp_path / "back") + "/")
    assert res.returncode == 0, res.stdout + res.stderr
    ours, theirs, original = _load(kind, tmp_path / "back"), _load(kind, out.parent, out.name), _load(kind, folder)
    assert type(ours).__name__ == CLASSES[kind]
    a, b, c = ours.state_dict(), theirs.state_dict(), original.state_dict()
    assert set(a) == set(b) == set(c)
    assert [k for k in a if not (torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]))] == []
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings", "rms_norm_eps", "vocab_size", "tie_word_embeddings"):
        assert getattr(ours.config, key) == getattr(original.config, key), key
    assert ours.config.rope_parameters["rope_theta"] == original.config.rope_parameters["rope_theta"]
    tokens = torch.tensor([[1, 5, 17, 42, 7, 9, 33, 60]])
    assert torch.equal(ours(tokens).logits, original(tokens).logits)


def test_qwen2_sliding_window_is_refused(tmp_path: Path) -> None:
    model = tiny_qwen2()
    model.config.use_sliding_window = True
    model.save_pretrained(tmp_path / "hf")
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(tmp_path / "m.gguf"))
    assert res.returncode != 0 and "sliding-window" in res.stdout + res.stderr

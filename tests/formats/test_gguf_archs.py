"""Qwen2, Phi-3, Gemma 2 and Gemma 3 Hugging Face folders <-> GGUF, checked by transformers' GGUF loader: it reads
our file back with every parameter `torch.equal` to the original (names, biases, no q/k permute:
llama.cpp rotates these as GPT-NeoX does; Gemma's norms stored as weight + 1, which it takes off
again), and the folder we make back from the GGUF equals what it reads from the same file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
from tests.support.gguf_models import tiny_gemma, tiny_gemma2, tiny_gemma3, tiny_phi3, tiny_qwen2  # noqa: E402

MODELS = {"qwen2": tiny_qwen2, "qwen2-tied": lambda: tiny_qwen2(tied=True), "phi3": tiny_phi3, "gemma2": tiny_gemma2,
          "gemma3": tiny_gemma3}
CLASSES = {"qwen2": "Qwen2ForCausalLM", "qwen2-tied": "Qwen2ForCausalLM", "phi3": "Phi3ForCausalLM",
           "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}


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
    elif arch == "gemma2":  # llama.cpp's weight + 1, what transformers takes off
        assert np.array_equal(tensors["blk.1.post_ffw_norm.weight"],
                              a["model.layers.1.post_feedforward_layernorm.weight"].numpy() + np.float32(1))
        assert r.fields["gemma2.attention.sliding_window"].contents() == 32
        assert r.fields["gemma2.final_logit_softcapping"].contents() == 30.0
        assert r.fields["tokenizer.ggml.add_space_prefix"].contents() is False
    elif arch == "gemma3":  # q/k norms + 1 too; the global layers' RoPE as llama.cpp's keys
        assert np.array_equal(tensors["blk.6.attn_k_norm.weight"],
                              a["model.layers.6.self_attn.k_norm.weight"].numpy() + np.float32(1))
        assert r.fields["gemma3.rope.freq_base"].contents() == 1_000_000.0
        assert r.fields["gemma3.rope.scaling.type"].contents() == "linear"
        assert r.fields["gemma3.rope.scaling.factor"].contents() == 4.0
        assert r.fields["gemma3.attention.sliding_window"].contents() == 16
    else:  # llama.cpp refuses the file unless these are UINT32
        field = r.fields["phi3.rope.scaling.original_context_length"]
        assert field.types == [gguf.GGUFValueType.UINT32] and field.contents() == 128
        assert np.array_equal(tensors["blk.0.attn_qkv.weight"], a["model.layers.0.self_attn.qkv_proj.weight"].numpy())
        assert np.array_equal(tensors["blk.1.ffn_up.weight"], a["model.layers.1.mlp.gate_up_proj.weight"].numpy())
    assert ("output.weight" in tensors) == (kind not in ("qwen2-tied", "gemma2", "gemma3"))


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
    if kind == "gemma3":  # by layer type
        assert ours.config.rope_parameters == original.config.rope_parameters
        assert ours.config.layer_types == original.config.layer_types
    else:
        assert ours.config.rope_parameters["rope_theta"] == original.config.rope_parameters["rope_theta"]
    tokens = torch.tensor([[1, 5, 17, 42, 7, 9, 33, 60] * 5])  # past the sliding windows
    assert torch.equal(ours(tokens).logits, original(tokens).logits)


def test_qwen2_sliding_window_is_refused(tmp_path: Path) -> None:
    model = tiny_qwen2()
    model.config.use_sliding_window = True
    model.save_pretrained(tmp_path / "hf")
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(tmp_path / "m.gguf"))
    assert res.returncode != 0 and "sliding-window" in res.stdout + res.stderr


def test_gemma2_bf16_norms_are_llama_cpp_s_weight_plus_one(tmp_path: Path) -> None:
    """A BF16 checkpoint with norms off the grid: the GGUF's norms are torch's w.float() + 1 (llama.cpp's
    converter widens BF16 to F32 first), F32; the other tensors stay BF16, byte for byte."""
    model = tiny_gemma2(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, dtype=torch.float32).to(torch.bfloat16))
    model.save_pretrained(tmp_path / "hf")
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(tmp_path / "m.gguf"))
    assert res.returncode == 0, res.stdout + res.stderr
    state = model.state_dict()
    tensors = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}
    for ours, theirs in (("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
                         ("blk.1.ffn_norm.weight", "model.layers.1.pre_feedforward_layernorm.weight"),
                         ("output_norm.weight", "model.norm.weight")):
        assert tensors[ours].tensor_type.name == "F32"
        assert np.asarray(tensors[ours].data).tobytes() == (state[theirs].float() + 1).numpy().tobytes(), ours
    q = tensors["blk.0.attn_q.weight"]
    assert q.tensor_type.name == "BF16"
    assert np.asarray(q.data).tobytes() == state["model.layers.0.self_attn.q_proj.weight"].view(torch.int16).numpy(
        ).tobytes()


def test_gemma2_untied_is_refused(tmp_path: Path) -> None:
    model = tiny_gemma2()
    model.config.tie_word_embeddings = False
    model.save_pretrained(tmp_path / "hf")
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(tmp_path / "m.gguf"))
    assert res.returncode != 0 and "tie_word_embeddings" in res.stdout + res.stderr


def test_gemma_round_trip(tmp_path: Path) -> None:
    """Gemma (1), which transformers' GGUF loader does not read (llama.cpp is its oracle:
    test_gguf_llamacpp.py): gguf-py reads norms of weight + 1 (torch's, in F32) and the key/values llama.cpp's
    converter writes; the folder made back loads in transformers equal to the original, logits too."""
    original = tiny_gemma()
    original.save_pretrained(tmp_path / "hf")
    out = tmp_path / "m.gguf"
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    r = gguf.GGUFReader(str(out))
    state = original.state_dict()
    tensors = {t.name: np.asarray(t.data) for t in r.tensors}
    assert r.fields["general.architecture"].contents() == "gemma" and "output.weight" not in tensors
    fields = r.fields
    assert fields["gemma.attention.key_length"].contents() == fields["gemma.attention.value_length"].contents() == 32
    assert np.array_equal(tensors["blk.1.ffn_norm.weight"],
                          (state["model.layers.1.post_attention_layernorm.weight"] + 1).numpy())
    assert np.array_equal(tensors["blk.0.attn_k.weight"], state["model.layers.0.self_attn.k_proj.weight"].numpy())
    res = migrate_in_process("convert", str(out), str(tmp_path / "back") + "/")
    assert res.returncode == 0, res.stdout + res.stderr
    back = transformers.GemmaForCausalLM.from_pretrained(tmp_path / "back").eval()
    a = back.state_dict()
    assert set(a) == set(state) and [k for k in a if not torch.equal(a[k], state[k])] == []
    for key in ("head_dim", "num_key_value_heads", "hidden_act", "tie_word_embeddings", "rms_norm_eps"):
        assert getattr(back.config, key) == getattr(original.config, key), key
    tokens = torch.tensor([[2, 5, 17, 42, 7, 9, 33, 60]])
    assert torch.equal(back(tokens).logits, original(tokens).logits)


def test_gemma3_config_of_the_hub_s_kind_and_refusals(tmp_path: Path) -> None:
    """A config.json as the Hub's Gemma 3 files spell it (rope_theta, rope_local_base_freq, rope_scaling, not
    transformers 5's rope_parameters by layer type) gives the same keys; a sliding-layer base other than
    llama.cpp's fixed 10000, or soft-capping (which llama.cpp's gemma3 does not do), is refused."""
    import json

    tiny_gemma3().save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    del config["rope_parameters"]
    config.update(rope_theta=500000.0, rope_local_base_freq=10000.0,
                  rope_scaling={"rope_type": "linear", "factor": 2.0})
    path.write_text(json.dumps(config))
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(tmp_path / "m.gguf"))
    assert res.returncode == 0, res.stdout + res.stderr
    fields = gguf.GGUFReader(str(tmp_path / "m.gguf")).fields
    assert fields["gemma3.rope.freq_base"].contents() == 500000.0
    assert fields["gemma3.rope.scaling.factor"].contents() == 2.0
    for change, said in (({"rope_local_base_freq": 20000.0}, "sliding layers"),
                         ({"final_logit_softcapping": 30.0}, "soft-caps nothing")):
        path.write_text(json.dumps({**config, **change}))
        res = migrate_in_process("convert", str(tmp_path / "hf"), str(tmp_path / "x.gguf"))
        assert res.returncode != 0 and said in res.stdout + res.stderr, res.stdout + res.stderr

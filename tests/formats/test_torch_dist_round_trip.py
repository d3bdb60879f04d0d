"""Hugging Face Llama -> `recipes/hf-llama-to-megatron.yaml` -> `recipes/megatron-llama-to-hf.yaml`, with no
config given by hand: the second run reads its head counts and writes its config.json from the `args` the
first run put in `common.pt`.

Oracles: transformers loads the folder the second run wrote, and its logits equal the source model's
(the same weights under the same settings: bit for bit); transformers reads the same settings from the
written config.json as from the source's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
TO_MEGATRON, TO_HF = REPO / "recipes" / "hf-llama-to-megatron.yaml", REPO / "recipes" / "megatron-llama-to-hf.yaml"
TOKENS = [[3, 17, 101, 5, 64, 119, 0, 42]]
SETTINGS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "hidden_act", "tie_word_embeddings",
            "attention_bias", "mlp_bias", "dtype", "rope_parameters")


def _llama(path: Path, tied: bool, dtype: Any) -> None:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=32, vocab_size=128, max_position_embeddings=64,
                                      rms_norm_eps=1e-6, rope_theta=500000.0, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # norms away from ones, so a swap of the two shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + 1.0)
    model.to(dtype).save_pretrained(path)


@pytest.mark.parametrize(("tied", "dtype"), [(False, "float32"), (True, "bfloat16")], ids=["untied-f32", "tied-bf16"])
def test_hf_to_megatron_and_back_with_the_checkpoints_own_args(tmp_path: Path, tied: bool, dtype: str) -> None:
    _llama(tmp_path / "llama", tied, getattr(torch, dtype))
    first = migrate_in_process("run", str(TO_MEGATRON), "--source", str(tmp_path / "llama"), "--target",
                               f"{tmp_path / 'megatron'}/", "--no-progress")
    assert first.returncode == 0, first.stderr
    second = migrate_in_process("run", str(TO_HF), "--source", str(tmp_path / "megatron"), "--target",
                                f"{tmp_path / 'hf2'}/", "--no-progress")
    assert second.returncode == 0, second.stderr
    written, given = (transformers.AutoConfig.from_pretrained(tmp_path / d) for d in ("hf2", "llama"))
    for key in SETTINGS:
        assert getattr(written, key) == getattr(given, key), key
    # both loaded by transformers the same way (a model cast in memory keeps its RoPE buffer in its dtype)
    source, back = (transformers.LlamaForCausalLM.from_pretrained(tmp_path / d).eval() for d in ("llama", "hf2"))
    assert back.dtype == source.dtype == getattr(torch, dtype)
    with torch.no_grad():
        tokens = torch.tensor(TOKENS)
        assert torch.equal(back(tokens).logits, source(tokens).logits)


FAMILY_SETTINGS = {"qwen2": (), "qwen3": (), "mixtral": ("num_local_experts", "num_experts_per_tok"),
                   "qwen3-moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob")}


@pytest.mark.parametrize("family", sorted(FAMILY_SETTINGS))
def test_each_family_goes_to_megatron_and_back_with_the_checkpoints_own_args(tmp_path: Path, family: str) -> None:
    """The families' recipes both ways: the args the HF -> Megatron recipe writes carry what the Megatron -> HF
    recipe needs (biases, q/k norms, experts, the router's normalisation), so no config is given by hand."""
    from tests.support.hf_families import tiny_model

    source = tiny_model(family, tmp_path / family)
    first = migrate_in_process("run", str(REPO / "recipes" / f"hf-{family}-to-megatron.yaml"), "--source",
                               str(tmp_path / family), "--target", f"{tmp_path / 'megatron'}/", "--no-progress")
    assert first.returncode == 0, first.stderr
    second = migrate_in_process("run", str(REPO / "recipes" / f"megatron-{family}-to-hf.yaml"), "--source",
                                str(tmp_path / "megatron"), "--target", f"{tmp_path / 'hf2'}/", "--no-progress")
    assert second.returncode == 0, second.stderr
    written, given = (transformers.AutoConfig.from_pretrained(tmp_path / d) for d in ("hf2", family))
    assert written.model_type == given.model_type
    if getattr(given, "head_dim", None) is None:  # Mixtral's config may leave it to hidden / heads
        given.head_dim = given.hidden_size // given.num_attention_heads
    for key in (*SETTINGS, *FAMILY_SETTINGS[family]):
        if hasattr(given, key):
            assert getattr(written, key) == getattr(given, key), key
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf2").eval()
    with torch.no_grad():
        tokens = torch.tensor(TOKENS)
        assert torch.equal(back(tokens).logits, source(tokens).logits)

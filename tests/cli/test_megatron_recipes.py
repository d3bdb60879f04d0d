"""The shipped Megatron -> Hugging Face recipes, run on checkpoints megatron-core 0.16.1 writes.

`tests/torch_dist_support.py` has megatron-core write a tiny GPT of each family (GQA, tensor-parallel
over 2 gloo ranks, vocabulary padded 120 -> 128) and run its own forward on CPU; the recipe is run
on the folder as a user would (`migrate run RECIPE --source CKPT --target OUT/`), transformers loads
OUT/ (with the config.json made from the checkpoint's arguments), and its logits must equal
megatron's for the same tokens (the vocabulary's padding rows aside).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import migrate_in_process
from torch_dist_support import FFN, GROUPS, HEADS, HIDDEN, LAYERS, TOKENS, VOCAB, cached_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow  # megatron-core writing on 2 ranks: ~15-50 s per family, once per session

REPO = Path(__file__).resolve().parents[2]
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_the_recipe_gives_megatrons_logits(family: str, tmp_path_factory: pytest.TempPathFactory,
                                           tmp_path: Path) -> None:
    folder, oracle = cached_checkpoint(tmp_path_factory, family)
    out = tmp_path / "hf"
    done = migrate_in_process("run", str(REPO / "recipes" / f"megatron-{family}-to-hf.yaml"), "--source", str(folder),
                              "--target", f"{out}/", "--no-progress")
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [CLASSES[family]]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]) == (
        HIDDEN, LAYERS, HEADS, GROUPS, FFN, VOCAB)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor(TOKENS)).logits
    expected = oracle["logits"][..., :VOCAB]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-4)
    # a control: the same weights with q and k of one group swapped no longer match
    sd = model.state_dict()
    q = sd["model.layers.0.self_attn.q_proj.weight"]
    q[:HIDDEN // HEADS] = q[HIDDEN // HEADS:2 * HIDDEN // HEADS].clone()
    with torch.no_grad():
        changed = model(torch.tensor(TOKENS)).logits
    assert not torch.allclose(changed, expected, atol=1e-3)

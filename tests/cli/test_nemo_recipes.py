"""The shipped Megatron -> Hugging Face recipe, run unchanged on a NeMo 2 checkpoint folder.

`tests/support/nemo.py` has megatron-core write the tensors NeMo saves (`module.`-prefixed, GQA,
tensor-parallel over 2 gloo ranks) with the context NeMo writes beside them, and run megatron's own
forward on CPU. `migrate run recipes/megatron-llama-to-hf.yaml --source NEMO_DIR --target OUT/` makes
the Hugging Face folder, its config.json from `context/model.yaml` (`target.hf_config`), and
transformers' logits on it must equal megatron's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.nemo import cached_nemo_checkpoint
from tests.support.torch_dist import FFN, GROUPS, HEADS, HIDDEN, LAYERS, PADDED, SEQ, TOKENS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow  # megatron-core writing on 2 ranks, once per session and layout

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("tied", [False, True])
def test_the_llama_recipe_gives_megatrons_logits(tied: bool, tmp_path_factory: pytest.TempPathFactory,
                                                 tmp_path: Path) -> None:
    folder, oracle = cached_nemo_checkpoint(tmp_path_factory, tied=tied)
    out = tmp_path / "hf"
    done = migrate_in_process("run", str(REPO / "recipes" / "megatron-llama-to-hf.yaml"), "--source", str(folder),
                              "--target", f"{out}/", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "read without the 'module.' prefix" in done.stdout + done.stderr  # the renaming is said
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is tied
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"],
            config["max_position_embeddings"], config["rms_norm_eps"], config["torch_dtype"]) == (
        HIDDEN, LAYERS, HEADS, GROUPS, FFN, PADDED, SEQ, 1e-5, "float32")
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor(TOKENS)).logits
    torch.testing.assert_close(logits, oracle["logits"], rtol=1e-5, atol=1e-4)
    # a control: k and v of one group swapped no longer match
    sd = model.state_dict()
    k, v = sd["model.layers.1.self_attn.k_proj.weight"], sd["model.layers.1.self_attn.v_proj.weight"]
    k[:HIDDEN // HEADS], v[:HIDDEN // HEADS] = v[:HIDDEN // HEADS].clone(), k[:HIDDEN // HEADS].clone()
    with torch.no_grad():
        changed = model(torch.tensor(TOKENS)).logits
    assert not torch.allclose(changed, oracle["logits"], atol=1e-3)

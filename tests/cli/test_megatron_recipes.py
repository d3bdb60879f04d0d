"""The shipped Megatron -> Hugging Face recipes, run on checkpoints megatron-core 0.16.1 writes.

`tests/support/torch_dist.py` has megatron-core write a tiny GPT of each family (GQA, tensor-parallel
over 2 gloo ranks, vocabulary padded 120 -> 128) and run its own forward on CPU; the recipe is run
on the folder as a user would (`migrate run RECIPE --source CKPT --target OUT/`), transformers loads
OUT/ (with the config.json made from the checkpoint's arguments), and its logits must equal
megatron's for the same tokens (the vocabulary's padding rows aside).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.torch_dist import FFN, GROUPS, HEADS, HIDDEN, LAYERS, TOKENS, TOPK, VOCAB, cached_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow  # megatron-core writing on 2 ranks: ~15-50 s per family, once per session

REPO = Path(__file__).resolve().parents[2]
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


@pytest.mark.parametrize(("family", "tied"), [(f, False) for f in sorted(CLASSES)] + [("llama", True)])
def test_the_recipe_gives_megatrons_logits(family: str, tied: bool, tmp_path_factory: pytest.TempPathFactory,
                                           tmp_path: Path) -> None:
    folder, oracle = cached_checkpoint(tmp_path_factory, family, tied=tied)
    out = tmp_path / "hf"
    recipe = f"megatron-{family.replace('_', '-')}-to-hf.yaml"
    done = migrate_in_process("run", str(REPO / "recipes" / recipe), "--source", str(folder),
                              "--target", f"{out}/", "--no-progress")
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [CLASSES[family]] and config["tie_word_embeddings"] is tied
    if family == "mixtral":
        assert (config["num_local_experts"], config["num_experts_per_tok"]) == (4, TOPK)
    if family == "qwen3_moe":
        assert (config["num_experts"], config["num_experts_per_tok"], config["norm_topk_prob"]) == (4, TOPK, True)
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


def test_the_docs_commands_run(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/training-checkpoints.md's Megatron commands, run as written on megatron-core's checkpoint."""
    import re
    import shlex
    import shutil

    folder, oracle = cached_checkpoint(tmp_path_factory, "llama")
    doc = (REPO / "docs" / "training-checkpoints.md").read_text()
    megatron = doc.split("\n## Megatron-core `torch_dist` checkpoints\n", 1)[1].split("\n## ", 1)[0]
    reading = megatron.split("\n### Reading one\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", reading, re.S)
    assert [kind for kind, _ in blocks] == ["sh"]
    shutil.copytree(folder, tmp_path / "ckpt" / "iter_0000100")
    shutil.copytree(REPO / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("*.py", "mergekit"))
    monkeypatch.chdir(tmp_path)
    for line in blocks[0][1].strip().splitlines():
        args = shlex.split(line, comments=True)
        assert args[0] == "migrate"
        done = migrate_in_process(*args[1:])
        assert done.returncode == 0, (line, done.stderr)
    from safetensors.torch import load_file

    flat = load_file(tmp_path / "megatron.safetensors")
    assert torch.equal(flat["decoder.layers.1.mlp.linear_fc1.weight"],
                       oracle["plain"]["decoder.layers.mlp.linear_fc1.weight"][1])
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]

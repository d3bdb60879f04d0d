"""Expert surgery with the row ops: recipes/mixtral-prune-experts.yaml (keep experts 0 and 2) on a Mixtral
transformers wrote, its tensors equal to compressed-tensors' MagnitudeExpertPruner told to keep the same
experts, and transformers loading the result with the logits of a reference model built here by torch
slicing; a Qwen3-MoE pruned with its `num_experts` derived from the routers; an expert extracted as a
dense Mistral (logits of a Mistral given that expert's MLP); a dense model upcycled into experts that all
equal its MLP behind a zero router (the dense model's logits: top-k weights sum to 1). Bad input
(an index out of range, a config edit contradicting the routers, fewer experts than num_experts_per_tok)
is a one-line error with nothing written."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[2]
PRUNE = REPO / "recipes" / "mixtral-prune-experts.yaml"
TOKENS = torch.tensor([[3, 17, 5, 60, 22, 9, 41, 0]])


def _mixtral(tmp_path: Path, experts: int = 4) -> tuple[Path, object]:
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=experts,
                                     num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).eval()
    folder = tmp_path / "mixtral"
    model.save_pretrained(folder)
    return folder, model


def _logits(model: object) -> object:
    with torch.no_grad():
        return model(TOKENS).logits  # type: ignore[operator]


def _experts_kept(sd: dict, like: dict, keep: list[int]) -> dict:
    """The reference's state dict by torch: the routers' rows and the stacked experts (as the model holds
    them) gathered by `keep`, everything else as it is."""
    index = torch.tensor(keep)
    sliced = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias", "experts.gate_up_proj", "experts.down_proj")
    return {k: sd[k].index_select(0, index) if k.endswith(sliced) else sd[k] for k in like}


def _run(*args: str) -> None:
    p = migrate_in_process("run", *map(str, args), "--no-progress")
    assert p.returncode == 0, p.stderr


def _refused(recipe: Path, src: Path, out: Path, *words: str, code: int = 1, per_layer: bool = False) -> None:
    """Refused in one line per problem (`per_layer`: the op's problem in each node it fails, as every op's)."""
    p = migrate_in_process("run", str(recipe), "--source", f"{src}/", "--target", f"{out}/", "--no-progress")
    assert p.returncode == code, p.stderr
    assert "Traceback" not in p.stderr
    problems = [ln for ln in p.stderr.splitlines() if ln.startswith(("error:", "migrate: error:", "/"))]
    assert len(problems) == (6 if per_layer else 1), p.stderr
    for w in words:
        assert w in problems[0], problems[0]
    assert not out.exists()


def test_the_pruning_recipe_equals_magnitude_expert_pruner_and_loads(tmp_path: Path) -> None:
    folder, model = _mixtral(tmp_path)
    out = tmp_path / "pruned"
    _run(PRUNE, "--source", f"{folder}/", "--target", f"{out}/")
    got = st.load_file(out / "model.safetensors")

    pruner_mod = pytest.importorskip("compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner")
    src = st.load_file(folder / "model.safetensors")
    routers = [n for n in src if n.endswith("block_sparse_moe.gate.weight")]
    experts = [n for n in src if ".experts." in n]
    pruner = pruner_mod.MagnitudeExpertPruner(
        router_pattern=r"block_sparse_moe\.gate\.weight$", expert_pattern=r"block_sparse_moe\.experts\.",
        sparsity=0.5, num_experts_config_key="num_local_experts", retained_experts={r: [0, 2] for r in routers},
        expert_to_router={n: n.split("experts.")[0] + "gate.weight" for n in experts},
        expert_indices={n: int(n.split("experts.")[1].split(".")[0]) for n in experts}, is_3d=False,
        num_experts_per_tok=2)
    want = pruner.process(dict(src))
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert torch.equal(got[name], t), name
    config = json.loads((out / "config.json").read_text())
    assert config["num_local_experts"] == 2
    assert pruner.update_model_config(json.loads((folder / "config.json").read_text()))["num_local_experts"] == 2

    # the reference: a 2-expert Mixtral given experts 0 and 2 and their router rows by torch
    ref_cfg = transformers.MixtralConfig(**{**model.config.to_dict(), "num_local_experts": 2})
    ref = transformers.MixtralForCausalLM(ref_cfg).eval()
    ref.load_state_dict(_experts_kept(model.state_dict(), ref.state_dict(), [0, 2]))
    loaded = transformers.MixtralForCausalLM.from_pretrained(out).eval()
    torch.testing.assert_close(_logits(loaded), _logits(ref), rtol=0, atol=1e-5)


def test_a_qwen3_moe_is_pruned_with_its_num_experts_derived(tmp_path: Path) -> None:
    def qwen_config(experts: int) -> object:
        return transformers.Qwen3MoeConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=4, num_experts=experts, num_experts_per_tok=2,
            max_position_embeddings=64)

    cfg = qwen_config(4)
    torch.manual_seed(1)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "qwen")
    (tmp_path / "r.yaml").write_text(textwrap.dedent(r"""
        version: 1
        source: {path: qwen/}
        ops:
          - stack: {from: 'model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+_proj)\.weight', over: 2,
                    to: 'model.layers.$1.mlp.experts.$3'}
          - gather: {from: 'model\.layers\.\d+\.mlp\.experts\.\w+_proj', drop: [0, 2]}
          - unstack: {from: 'model\.layers\.(\d+)\.mlp\.experts\.(\w+_proj)',
                      to: 'model.layers.$1.mlp.experts.$i.$2.weight'}
          - gather: {from: 'model\.layers\.\d+\.mlp\.gate\.weight', drop: [0, 2]}
        target: {path: out/, copy: [config.json]}
    """), encoding="utf-8")
    p = migrate_in_process("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 0, p.stderr
    # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts: the key the config holds is updated
    said = json.loads((tmp_path / "qwen" / "config.json").read_text())
    key = next(k for k in ("num_local_experts", "num_experts") if k in said)
    assert f"config.json: {key} 4 -> 2" in p.stdout + p.stderr
    assert json.loads((tmp_path / "out" / "config.json").read_text())[key] == 2
    ref = transformers.Qwen3MoeForCausalLM(qwen_config(2)).eval()
    ref.load_state_dict(_experts_kept(model.state_dict(), ref.state_dict(), [1, 3]))
    loaded = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path / "out").eval()
    torch.testing.assert_close(_logits(loaded), _logits(ref), rtol=0, atol=1e-5)


def test_a_deepseek_v3_is_pruned_with_its_routing_bias(tmp_path: Path) -> None:
    """DeepSeek-V3: routed experts beside a shared one (kept), a routing bias per expert gathered with the
    router's rows, n_routed_experts derived; the dense first layer untouched."""
    def deepseek_config(experts: int) -> object:
        return transformers.DeepseekV3Config(
            vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=experts, num_experts_per_tok=2, n_group=1,
            topk_group=1, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=8, q_lora_rank=8,
            qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4, max_position_embeddings=64)

    torch.manual_seed(2)
    model = transformers.DeepseekV3ForCausalLM(deepseek_config(4)).eval()
    with torch.no_grad():  # a bias that changes which experts are picked
        model.model.layers[1].mlp.gate.e_score_correction_bias.normal_()
    model.save_pretrained(tmp_path / "ds")
    (tmp_path / "r.yaml").write_text(textwrap.dedent(r"""
        version: 1
        source: {path: ds/}
        ops:
          - stack: {from: 'model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+_proj)\.weight', over: 2,
                    to: 'model.layers.$1.mlp.experts.$3'}
          - gather: {from: 'model\.layers\.\d+\.mlp\.experts\.\w+_proj', keep: [1, 3]}
          - unstack: {from: 'model\.layers\.(\d+)\.mlp\.experts\.(\w+_proj)',
                      to: 'model.layers.$1.mlp.experts.$i.$2.weight'}
          - gather: {from: 'model\.layers\.\d+\.mlp\.gate\.(weight|e_score_correction_bias)', keep: [1, 3]}
        target: {path: out/, copy: [config.json]}
    """), encoding="utf-8")
    p = migrate_in_process("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "out" / "config.json").read_text())["n_routed_experts"] == 2
    ref = transformers.DeepseekV3ForCausalLM(deepseek_config(2)).eval()
    ref.load_state_dict(_experts_kept(model.state_dict(), ref.state_dict(), [1, 3]))
    loaded = transformers.DeepseekV3ForCausalLM.from_pretrained(tmp_path / "out").eval()
    torch.testing.assert_close(_logits(loaded), _logits(ref), rtol=0, atol=1e-5)


def test_bad_pruning_is_one_line_with_nothing_written(tmp_path: Path) -> None:
    folder, _ = _mixtral(tmp_path)
    text = PRUNE.read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("keep: [0, 2]}\n  - unstack", "keep: [0, 4]}\n  - unstack"), encoding="utf-8")
    _refused(bad, folder, tmp_path / "o1", "ops[1].gather.keep: row 4 is outside dim 0 of "
             "'model.layers.0.block_sparse_moe.experts.w1' (size 4", code=2, per_layer=True)
    bad.write_text(text.replace("{num_local_experts: 2}", "{num_local_experts: 3}"), encoding="utf-8")
    _refused(bad, folder, tmp_path / "o2", "target.config: num_local_experts: 3 contradicts the tensors: the "
             "routers ('model.layers.0.block_sparse_moe.gate.weight', ...) have 2 rows")
    bad.write_text(text.replace("keep: [0, 2]", "keep: [2]").replace("{num_local_experts: 2}", "{}"),
                   encoding="utf-8")
    _refused(bad, folder, tmp_path / "o3", "num_experts_per_tok 2 is more than the 1 experts kept")
    bad.write_text(text.replace("  copy: [config.json]\n", ""), encoding="utf-8")
    _refused(bad, folder, tmp_path / "o4", "target.config edits the config.json copied into the folder target")


EXTRACT = r"""
version: 1
source: {path: mixtral/}
remap:
  - {from: '\.block_sparse_moe\.experts\.1\.w1\.', to: '.mlp.gate_proj.'}
  - {from: '\.block_sparse_moe\.experts\.1\.w3\.', to: '.mlp.up_proj.'}
  - {from: '\.block_sparse_moe\.experts\.1\.w2\.', to: '.mlp.down_proj.'}
filter:
  exclude: [{regex: '\.block_sparse_moe\.'}]
target:
  path: dense/
  copy: [config.json]
  config: {architectures: [MistralForCausalLM], model_type: mistral, num_local_experts: null,
           num_experts_per_tok: null, router_aux_loss_coef: null, router_jitter_noise: null,
           output_router_logits: null}
"""


def test_one_expert_extracted_as_a_dense_mistral(tmp_path: Path) -> None:
    folder, model = _mixtral(tmp_path)
    (tmp_path / "r.yaml").write_text(EXTRACT, encoding="utf-8")
    _run(tmp_path / "r.yaml")
    config = json.loads((tmp_path / "dense" / "config.json").read_text())
    assert config["model_type"] == "mistral" and "num_local_experts" not in config
    # the reference: a Mistral given expert 1's MLP, by torch from the Mixtral's own file
    src = st.load_file(folder / "model.safetensors")
    ref = transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rope_theta=model.config.rope_parameters["rope_theta"],
        rms_norm_eps=model.config.rms_norm_eps, tie_word_embeddings=False)).eval()
    mlp = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    sd = {}
    for k in ref.state_dict():
        parts = k.split(".")
        sd[k] = src[k] if ".mlp." not in k else src[
            f"model.layers.{parts[2]}.block_sparse_moe.experts.1.{mlp[parts[4]]}.weight"]
    ref.load_state_dict(sd)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense").eval()
    assert type(loaded).__name__ == "MistralForCausalLM"
    torch.testing.assert_close(_logits(loaded), _logits(ref), rtol=0, atol=1e-5)


UPCYCLE = r"""
version: 1
source: {path: dense/}
ops:
  - clone: {from: 'model\.layers\.(\d+)\.mlp\.gate_proj\.weight', count: 3, keep: false,
            to: 'model.layers.$1.block_sparse_moe.experts.$i.w1.weight'}
  - clone: {from: 'model\.layers\.(\d+)\.mlp\.up_proj\.weight', count: 3, keep: false,
            to: 'model.layers.$1.block_sparse_moe.experts.$i.w3.weight'}
  - clone: {from: 'model\.layers\.(\d+)\.mlp\.down_proj\.weight', count: 3, keep: false,
            to: 'model.layers.$1.block_sparse_moe.experts.$i.w2.weight'}
  - new: {from: 'model\.layers\.(\d+)\.post_attention_layernorm\.weight', shape: [3, '${config.hidden_size}'],
          to: 'model.layers.$1.block_sparse_moe.gate.weight', FILL}
target:
  path: moe/
  copy: [config.json]
  config: {architectures: [MixtralForCausalLM], model_type: mixtral, num_local_experts: 3, num_experts_per_tok: 2}
"""


@pytest.mark.parametrize("fill", ["fill: zeros", "fill: normal, std: 0.5, seed: 7"])
def test_a_dense_model_upcycled_into_experts_keeps_its_logits(tmp_path: Path, fill: str) -> None:
    """Every expert equal to the dense MLP: whatever the router says, the top-2 weights sum to 1 (Mixtral
    renormalizes them), so the MoE computes the dense model's function."""
    cfg = transformers.MistralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     tie_word_embeddings=False)
    torch.manual_seed(4)
    dense = transformers.MistralForCausalLM(cfg).eval()
    dense.save_pretrained(tmp_path / "dense")
    (tmp_path / "r.yaml").write_text(UPCYCLE.replace("FILL", fill), encoding="utf-8")
    _run(tmp_path / "r.yaml")
    moe = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "moe").eval()
    assert type(moe).__name__ == "MixtralForCausalLM" and moe.config.num_local_experts == 3
    torch.testing.assert_close(_logits(moe), _logits(dense), rtol=0, atol=1e-5)
    router = st.load_file(tmp_path / "moe" / "model.safetensors")["model.layers.1.block_sparse_moe.gate.weight"]
    if fill == "fill: zeros":
        assert torch.equal(router, torch.zeros(3, 16))
        return
    # the documented generator: numpy's PCG64 seeded with [seed, four words of the name's SHA-256]
    import hashlib

    import numpy as np

    name = "model.layers.1.block_sparse_moe.gate.weight"
    digest = hashlib.sha256(name.encode()).digest()
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [7, *(int.from_bytes(digest[k:k + 4], "little") for k in range(0, 16, 4))])))
    want = torch.from_numpy((rng.standard_normal(48) * 0.5).astype(np.float32).reshape(3, 16))
    assert torch.equal(router, want)

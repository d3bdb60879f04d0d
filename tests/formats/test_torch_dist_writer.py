"""The torch_dist target and recipes/hf-llama-to-megatron.yaml, against megatron-core 0.16.1 itself.

Oracles: megatron-core's `dist_checkpointing.load` of the converted folder into the sharded state dict
its own GPTModel builds for the Hugging Face config (`tests/support/megatron_load.py`: local layer
spec, one gloo rank on CPU), `load_state_dict(strict=True)`, and megatron's forward: its logits against
transformers' LlamaForCausalLM on the same weights, and every tensor it loaded against the Hugging Face
tensors rearranged by torch here (q/k/v per KV group, gate;up). megatron-core's own `CheckpointingConfig`
and torch's `torch.load` read `metadata.json` and `common.pt`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.megatron_load import TOKENS, load_into_megatron

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")
st_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.slow  # megatron-core imported in a new process: ~25 s under load

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "hf-llama-to-megatron.yaml"
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 64, 2, 4, 2, 96, 128


def tiny_llama(path: Path, *, tied: bool = False) -> Any:
    """A Hugging Face Llama (GQA) saved at `path`; its norms away from ones so a swap shows."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                   num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                   max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + 1.0)
    model.eval()
    model.save_pretrained(path)
    return model


def megatron_layout(hf: dict[str, Any]) -> dict[str, Any]:
    """The Hugging Face tensors as megatron's GPTModel (local spec) names and lays them out, by torch."""
    head_dim, per_group = HIDDEN // HEADS, HEADS // KV_HEADS
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf["model.norm.weight"], "output_layer.weight": hf["lm_head.weight"]}
    for i in range(LAYERS):
        a, m = f"model.layers.{i}.self_attn.", f"decoder.layers.{i}."
        q = hf[a + "q_proj.weight"].view(KV_HEADS, per_group * head_dim, HIDDEN)
        k = hf[a + "k_proj.weight"].view(KV_HEADS, head_dim, HIDDEN)
        v = hf[a + "v_proj.weight"].view(KV_HEADS, head_dim, HIDDEN)
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, HIDDEN)
        out[m + "self_attention.linear_proj.weight"] = hf[a + "o_proj.weight"]
        out[m + "input_layernorm.weight"] = hf[f"model.layers.{i}.input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[f"model.layers.{i}.post_attention_layernorm.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[f"model.layers.{i}.mlp.gate_proj.weight"],
                                                      hf[f"model.layers.{i}.mlp.up_proj.weight"]])
        out[m + "mlp.linear_fc2.weight"] = hf[f"model.layers.{i}.mlp.down_proj.weight"]
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny Llama through the recipe, and megatron's reading of the result."""
    tmp = tmp_path_factory.mktemp("hf-to-megatron")
    model = tiny_llama(tmp / "llama")
    out = tmp / "megatron"
    run = migrate_in_process("run", str(RECIPE), "--source", str(tmp / "llama"), "--target", f"{out}/",
                             "--no-progress")
    assert run.returncode == 0, run.stderr
    with torch.no_grad():
        logits = model(torch.tensor(TOKENS)).logits
    return {"tmp": tmp, "out": out, "stderr": run.stderr + run.stdout, "hf_logits": logits,
            "hf": st_torch.load_file(str(tmp / "llama" / "model.safetensors")),
            "megatron": load_into_megatron(out, tmp / "llama" / "config.json", tmp / "megatron-read.pt")}


def test_megatron_loads_the_converted_llama_and_gives_its_logits(converted: dict[str, Any]) -> None:
    logits = converted["megatron"]["logits"]
    assert logits.shape == converted["hf_logits"].shape == (1, len(TOKENS[0]), VOCAB)
    torch.testing.assert_close(logits, converted["hf_logits"], rtol=1e-5, atol=1e-5)


def test_every_tensor_megatron_loaded_is_the_hf_one_rearranged(converted: dict[str, Any]) -> None:
    loaded, expected = converted["megatron"]["state"], megatron_layout(converted["hf"])
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


def test_two_tensor_parallel_ranks_load_their_parts_and_give_the_logits(converted: dict[str, Any]) -> None:
    """Each rank reads its rows (linear_qkv, linear_fc1: gate and up halves) or columns out of the whole chunks."""
    tmp = converted["tmp"]
    read = load_into_megatron(converted["out"], tmp / "llama" / "config.json", tmp / "megatron-tp2.pt", ranks=2)
    torch.testing.assert_close(read["logits"], converted["hf_logits"], rtol=1e-5, atol=1e-5)
    whole = megatron_layout(converted["hf"])
    for name, rows in [("decoder.layers.1.self_attention.linear_qkv.weight", slice(0, 64)),
                       ("embedding.word_embeddings.weight", slice(0, VOCAB // 2))]:
        assert torch.equal(read["state"][name], whole[name][rows]), name
    gate, up = whole["decoder.layers.0.mlp.linear_fc1.weight"].chunk(2)
    fc1 = read["state"]["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1, torch.cat([gate[:FFN // 2], up[:FFN // 2]]))
    assert torch.equal(read["state"]["decoder.layers.0.self_attention.linear_proj.weight"],
                       whole["decoder.layers.0.self_attention.linear_proj.weight"][:, :HIDDEN // 2])


def test_a_tied_llama_has_no_output_layer_and_megatron_shares_the_embedding(tmp_path: Path) -> None:
    model = tiny_llama(tmp_path / "llama", tied=True)
    run = migrate_in_process("run", str(RECIPE), "--source", str(tmp_path / "llama"), "--target",
                             f"{tmp_path / 'out'}/", "--no-progress")
    assert run.returncode == 0, run.stderr
    read = load_into_megatron(tmp_path / "out", tmp_path / "llama" / "config.json", tmp_path / "read.pt")
    assert "output_layer.weight" not in read["state"]
    with torch.no_grad():
        torch.testing.assert_close(read["logits"], model(torch.tensor(TOKENS)).logits, rtol=1e-5, atol=1e-5)


def test_the_folder_holds_what_megatron_core_writes(converted: dict[str, Any]) -> None:
    from megatron.core.dist_checkpointing.core import CheckpointingConfig, maybe_load_config

    out = converted["out"]
    assert sorted(p.name for p in out.iterdir()) == [".metadata", "__0_0.distcp", "common.pt", "metadata.json"]
    assert maybe_load_config(str(out)) == CheckpointingConfig("torch_dist")
    assert json.loads((out / "metadata.json").read_text()) == {
        "sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
        "common_backend_version": 1}
    common = torch.load(out / "common.pt", weights_only=False)  # Megatron-LM's: args, checkpoint_version, iteration
    assert sorted(common) == ["args", "checkpoint_version", "iteration"]
    assert "8 empty _extra_state entries written" in converted["stderr"]


CONFIG_FIELDS = {"num_layers": "num_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "ffn_hidden_size",
                 "num_attention_heads": "num_attention_heads", "num_query_groups": "num_query_groups",
                 "kv_channels": "kv_channels", "norm_epsilon": "layernorm_epsilon",
                 "layernorm_epsilon": "layernorm_epsilon", "normalization": "normalization",
                 "swiglu": "gated_linear_unit", "add_bias_linear": "add_bias_linear", "add_qkv_bias": "add_qkv_bias",
                 "qk_layernorm": "qk_layernorm", "rotary_interleaved": "rotary_interleaved",
                 "params_dtype": "params_dtype"}
"""Megatron-LM's argument -> the TransformerConfig field it becomes (`core_transformer_config_from_args`:
a field's namesake, `norm_epsilon` as `layernorm_epsilon` before 2026, `swiglu` as `gated_linear_unit`)."""
MODEL_FIELDS = {"padded_vocab_size": "vocab_size", "max_position_embeddings": "max_sequence_length",
                "position_embedding_type": "position_embedding_type", "rotary_percent": "rotary_percent",
                "rotary_base": "rotary_base", "use_rope_scaling": "rotary_scaling"}
"""Megatron-LM's argument -> the GPTModel setting it becomes (its `gpt_builders.py`)."""


def test_the_args_megatron_loads_are_the_model_it_builds_for_the_config(converted: dict[str, Any]) -> None:
    """What megatron's `load` returned from common.pt, through Megatron-LM's rules, equals the TransformerConfig
    and GPTModel settings the harness built from the Hugging Face config.json (not from migrator's output)."""
    read = converted["megatron"]
    common, config, model = read["common"], read["config"], read["model"]
    assert (common["checkpoint_version"], common["iteration"]) == (3.0, 0)
    args = common["args"]
    assert args["group_query_attention"] is True  # else Megatron-LM would not give num_query_groups
    for arg, field in CONFIG_FIELDS.items():
        assert args[arg] == config[field], (arg, field)
    for arg, setting in MODEL_FIELDS.items():
        assert args[arg] == model[setting], (arg, setting)
    assert args["untie_embeddings_and_output_weights"] is not model["share_embeddings_and_output_weights"]
    assert "num_experts" not in args and config.get("num_moe_experts") is None


def test_a_layer_left_unstacked_is_refused_and_the_target_kept(converted: dict[str, Any]) -> None:
    tmp, out = converted["tmp"], converted["out"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    src = tmp / "unstacked.safetensors"
    st_torch.save_file({"decoder.layers.0.mlp.linear_fc2.weight": torch.zeros(4, 4)}, str(src))
    run = migrate_in_process("convert", str(src), str(out), "--to", "torch_dist", "--overwrite")
    assert run.returncode == 1, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "decoder.layers.0.mlp.linear_fc2.weight" in run.stderr and "stack" in run.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    hf = migrate_in_process("convert", str(tmp / "llama"), str(out), "--to", "torch_dist", "--overwrite")
    assert hf.returncode == 1 and "'model.layers.0." in hf.stderr and "hf-llama-to-megatron.yaml" in hf.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_layers_that_disagree_on_their_count_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "stacked.safetensors"
    st_torch.save_file({"decoder.layers.mlp.linear_fc2.weight": torch.zeros(2, 4, 4),
                        "decoder.layers.mlp.linear_fc1.weight": torch.zeros(3, 8, 4)}, str(src))
    run = migrate_in_process("convert", str(src), str(tmp_path / "out"), "--to", "torch_dist")
    assert run.returncode == 1, run.stderr
    line = run.stderr.strip()  # safetensors holds them by name: fc1 (3 layers) is met first
    assert "\n" not in line and "'decoder.layers.mlp.linear_fc2.weight': its layer axis has 2 layers" in line
    assert "decoder.layers.mlp.linear_fc1.weight has 3" in line
    assert not (tmp_path / "out").exists()


def test_convert_writes_megatron_names_given_as_they_are(tmp_path: Path) -> None:
    """A file already in megatron's names: `convert --to torch_dist` writes the folder torch's DCP reads back."""
    import torch.distributed.checkpoint as dcp

    tensors = {"decoder.layers.mlp.linear_fc2.weight": torch.randn(2, 4, 6), "output_layer.weight": torch.randn(5, 4)}
    st_torch.save_file(tensors, str(tmp_path / "m.safetensors"))
    run = migrate_in_process("convert", str(tmp_path / "m.safetensors"), str(tmp_path / "ckpt"), "--to", "torch_dist")
    assert run.returncode == 0, run.stderr
    md = dcp.FileSystemReader(str(tmp_path / "ckpt")).read_metadata()
    assert sorted(md.state_dict_metadata) == ["decoder.layers.mlp.linear_fc2._extra_state/shard_0_2",
                                              "decoder.layers.mlp.linear_fc2._extra_state/shard_1_2",
                                              "decoder.layers.mlp.linear_fc2.weight", "output_layer.weight"]
    back = {k: torch.empty_like(v) for k, v in tensors.items()}
    dcp.load(back, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    for k, v in tensors.items():
        assert torch.equal(back[k], v), k


def test_the_torch_dist_reader_reads_it_back_layer_by_layer(converted: dict[str, Any]) -> None:
    """migrator's own torch_dist reader (mg-read's) on the folder: each layer's tensor is the Hugging Face one
    rearranged by torch, the empty _extra_state entries noted and left out."""
    back = converted["tmp"] / "back.safetensors"
    run = migrate_in_process("convert", str(converted["out"]), str(back))
    assert run.returncode == 0, run.stderr
    assert "8 Transformer Engine _extra_state items" in run.stderr + run.stdout
    got, expected = st_torch.load_file(str(back)), megatron_layout(converted["hf"])
    renamed = {k.replace("input_layernorm.", "self_attention.linear_qkv.layer_norm_")
               .replace("pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm_"): v for k, v in expected.items()}
    assert sorted(got) == sorted(renamed)
    for name, tensor in renamed.items():
        assert torch.equal(got[name], tensor), name

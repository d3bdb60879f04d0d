"""The training arguments a `torch_dist` target's `common.pt` holds (`formats/megatron/from_hf.py`).

Oracles: transformers' own config classes for the five families (the arguments made from a config.json,
turned back into one by `target.hf_config` and read by transformers, give the settings transformers read
from the original: the table and its inverse checked against each other through transformers), and
`torch.load` of the written `common.pt` (a real `argparse.Namespace`, a real torch dtype, what migrator's
restricted reader reads back). What the arguments cannot express is refused: exit 1, one line, no target.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from migrator.core.errors import PlanError
from migrator.formats.megatron.from_hf import Facts, megatron_args
from migrator.formats.torch_dist.hf_config import hf_config
from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "hf-llama-to-megatron.yaml"
SIZES = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64, "rms_norm_eps": 1e-6}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"rope_theta": 500000.0}),
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True}),
    "qwen2": ("Qwen2Config", {"rope_theta": 1000000.0}),
    "qwen3": ("Qwen3Config", {"head_dim": 32}),  # not hidden / heads: kv_channels must come from it
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02}),
    "qwen3_moe": ("Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "norm_topk_prob": True}),
}
COMPARED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "hidden_act", "tie_word_embeddings",
            "attention_bias", "mlp_bias", "num_local_experts", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "norm_topk_prob", "router_aux_loss_coef")
"""The settings of a model transformers builds from a config, compared where the family has them."""


def _config(family: str, **change: Any) -> Any:
    cls, extra = FAMILIES[family]
    return getattr(transformers, cls)(**{**SIZES, **extra, **change})


def _json(config: Any) -> dict[str, Any]:
    return json.loads(config.to_json_string())


def _shapes(config: Any) -> dict[str, tuple[int, ...]]:
    rows = (config.vocab_size, config.hidden_size)
    output = {} if config.tie_word_embeddings else {"output_layer.weight": rows}
    return {"embedding.word_embeddings.weight": rows, **output}


def _setting(config: Any, key: str) -> Any:
    """What the model uses: a head_dim left None is hidden_size / num_attention_heads (Mixtral's, Qwen2's)."""
    value = getattr(config, key)
    return config.hidden_size // config.num_attention_heads if key == "head_dim" and value is None else value


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_arguments_give_back_the_config_transformers_read(family: str) -> None:
    original = _config(family)
    args = megatron_args(_json(original), "config.json", Facts(original.vocab_size, not original.tie_word_embeddings,
                                                               "float32", original.num_hidden_layers))
    made = hf_config(args, _shapes(original), "ckpt")
    back = transformers.CONFIG_MAPPING[made["model_type"]](**{k: v for k, v in made.items() if k != "model_type"})
    assert type(back) is type(original)
    for key in COMPARED:
        if hasattr(original, key):
            assert _setting(back, key) == _setting(original, key), key
    assert back.rope_parameters["rope_theta"] == original.rope_parameters["rope_theta"]
    assert back.rope_parameters.get("rope_type", "default") == "default"


def test_what_the_table_says_for_a_qwen3_moe() -> None:
    args = megatron_args(_json(_config("qwen3_moe")), "config.json")
    assert {k: args[k] for k in ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "ffn_hidden_size",
                                 "qk_layernorm", "add_qkv_bias", "moe_router_pre_softmax", "kv_channels")} == {
        "num_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32, "ffn_hidden_size": 96,
        "qk_layernorm": True, "add_qkv_bias": False, "moe_router_pre_softmax": False, "kv_channels": 16}
    # without renormalized top-k weights, Megatron's router takes its softmax first
    assert megatron_args(_json(_config("qwen3_moe", norm_topk_prob=False)), "c")["moe_router_pre_softmax"] is True


def test_llama3_rope_scaling_is_megatrons_use_rope_scaling() -> None:
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    args = megatron_args(_json(_config("llama", rope_parameters=rope)), "config.json")
    assert (args["use_rope_scaling"], args["rope_scaling_factor"], args["rotary_base"]) == (True, 32.0, 500000)
    assert args["rotary_base"].__class__ is int  # Megatron-LM's --rotary-base is an int


@pytest.mark.parametrize(("family", "change", "words"), [
    ("llama", {"hidden_act": "gelu"}, "hidden_act gelu"),
    ("llama", {"attention_bias": True}, "attention_bias true with mlp_bias false"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "RoPE scaling 'yarn'"),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 2.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
     "low_freq_factor 2.0"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16}, "a sliding attention window"),
    ("qwen3_moe", {"decoder_sparse_step": 2}, "experts in some layers only"),
])
def test_what_the_arguments_cannot_express_is_refused(family: str, change: dict[str, Any], words: str) -> None:
    with pytest.raises(PlanError, match="config.json: .*" + words):
        megatron_args(_json(_config(family, **change)), "config.json")


def test_a_family_the_table_does_not_know_is_refused() -> None:
    gpt2 = json.loads(transformers.GPT2Config(n_layer=2).to_json_string())
    with pytest.raises(PlanError, match="model_type 'gpt2': arguments are derived for llama, qwen2"):
        megatron_args(gpt2, "config.json")


def _tiny_llama(path: Path, dtype: Any = None, **change: Any) -> Any:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config("llama", **change))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path)
    return model


def test_common_pt_is_megatron_lms_namespace_and_migrator_reads_it_back(tmp_path: Path) -> None:
    """A bfloat16 Llama: torch builds the args Namespace, with torch.bfloat16; migrator's reader gives its fields."""
    from migrator.core.bytesource import FileSource
    from migrator.core.limits import DEFAULT_LIMITS
    from migrator.formats.torch_dist.common import read_common

    _tiny_llama(tmp_path / "llama", torch.bfloat16)
    run = migrate_in_process("run", str(RECIPE), "--source", str(tmp_path / "llama"), "--target",
                             f"{tmp_path / 'out'}/", "--no-progress")
    assert run.returncode == 0, run.stderr
    common = torch.load(tmp_path / "out" / "common.pt", weights_only=False)
    assert sorted(common) == ["args", "checkpoint_version", "iteration"]
    assert (common["checkpoint_version"], common["iteration"]) == (3.0, 0)
    args = common["args"]
    assert type(args) is argparse.Namespace
    assert (args.params_dtype, args.bf16, args.fp16) == (torch.bfloat16, True, False)
    assert (args.num_layers, args.num_query_groups, args.kv_channels, args.norm_epsilon) == (2, 2, 16, 1e-6)
    assert (args.rotary_base, args.untie_embeddings_and_output_weights) == (500000, True)
    with torch.serialization.safe_globals([argparse.Namespace]):  # what megatron-core registers, then loads
        assert vars(torch.load(tmp_path / "out" / "common.pt", weights_only=True)["args"]) == vars(args)
    read = read_common(FileSource(tmp_path / "out" / "common.pt"), DEFAULT_LIMITS)
    assert read["args"] == {k: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v
                            for k, v in vars(args).items()}
    note = next(line for line in (run.stdout + run.stderr).splitlines() if "common.pt holds" in line)
    assert "num_layers 2 (num_hidden_layers)" in note and "norm_epsilon 1e-06 (rms_norm_eps)" in note
    assert str(tmp_path / "llama" / "config.json") in note


def test_a_config_the_arguments_cannot_express_stops_the_run(tmp_path: Path) -> None:
    _tiny_llama(tmp_path / "llama")
    config = tmp_path / "llama" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "hidden_act": "gelu"}))
    run = migrate_in_process("run", str(RECIPE), "--source", str(tmp_path / "llama"), "--target",
                             f"{tmp_path / 'out'}/", "--no-progress")
    assert run.returncode == 1, run.stderr
    line, *rest = run.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(config) in line and "hidden_act gelu" in line, line
    assert rest == [f"migrate: nothing written to {tmp_path / 'out'}"]
    assert not (tmp_path / "out").exists()


def test_without_a_config_common_pt_stays_empty_and_a_note_says_so(tmp_path: Path) -> None:
    st_torch = pytest.importorskip("safetensors.torch")
    st_torch.save_file({"decoder.layers.mlp.linear_fc2.weight": torch.randn(2, 4, 6)}, str(tmp_path / "m.safetensors"))
    run = migrate_in_process("convert", str(tmp_path / "m.safetensors"), str(tmp_path / "ckpt"), "--to", "torch_dist")
    assert run.returncode == 0, run.stderr
    assert torch.load(tmp_path / "ckpt" / "common.pt", weights_only=True) == {}
    assert "common.pt holds no training arguments ({}): no config.json beside the source" in run.stdout + run.stderr


def test_a_2026_megatron_lms_layernorm_epsilon_is_read_as_norm_epsilon() -> None:
    """Megatron-LM's arguments are TransformerConfig's fields since 2026: `layernorm_epsilon`, no `norm_epsilon`."""
    original = _config("llama")
    args = megatron_args(_json(original), "config.json")
    del args["norm_epsilon"]
    assert hf_config(args, _shapes(original), "ckpt")["rms_norm_eps"] == original.rms_norm_eps


MEGATRON_CONFIG = r'''
import json, sys
import torch
from megatron.core.transformer.transformer_config import TransformerConfig

out = {}
for family, hf in json.loads(sys.stdin.read()).items():
    moe = hf["model_type"] in ("mixtral", "qwen3_moe")
    experts = hf.get("num_local_experts", hf.get("num_experts"))
    heads = hf["num_attention_heads"]
    config = TransformerConfig(
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"], num_attention_heads=heads,
        num_query_groups=hf["num_key_value_heads"], ffn_hidden_size=hf["intermediate_size"],
        kv_channels=hf.get("head_dim") or hf["hidden_size"] // heads, layernorm_epsilon=hf["rms_norm_eps"],
        normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, add_qkv_bias=hf["model_type"] == "qwen2",
        qk_layernorm=hf["model_type"] in ("qwen3", "qwen3_moe"),
        **({"num_moe_experts": experts, "moe_router_topk": hf["num_experts_per_tok"],
            "moe_ffn_hidden_size": hf.get("moe_intermediate_size") or hf["intermediate_size"],
            "moe_router_pre_softmax": not hf.get("norm_topk_prob", True),
            "moe_aux_loss_coeff": hf.get("router_aux_loss_coef", 0.0)} if moe else {}))
    out[family] = {k: (str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v)
                   for k, v in vars(config).items() if v is None or isinstance(v, (bool, int, float, str, torch.dtype))}
print(json.dumps(out))
'''
"""megatron-core builds the TransformerConfig of each Hugging Face config (as a Megatron user sets it up from
the model card: grouped-query attention, RMSNorm, SwiGLU, Qwen2's q/k/v biases, Qwen3's q/k norms, the
experts), in its own process."""
SAME_NAME = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
             "layernorm_epsilon", "normalization", "add_bias_linear", "add_qkv_bias", "qk_layernorm",
             "rotary_interleaved", "params_dtype", "moe_router_topk", "moe_ffn_hidden_size", "moe_router_pre_softmax",
             "moe_aux_loss_coeff")
TO_CONFIG = {**{name: name for name in SAME_NAME}, "norm_epsilon": "layernorm_epsilon", "swiglu": "gated_linear_unit",
             "num_experts": "num_moe_experts"}
"""Megatron-LM's argument -> the TransformerConfig field it becomes (`core_transformer_config_from_args`)."""


@pytest.mark.slow  # megatron-core imported in a new process
def test_each_familys_arguments_are_the_transformer_config_megatron_builds() -> None:
    import subprocess
    import sys

    pytest.importorskip("megatron.core")
    hf = {family: _json(_config(family)) for family in FAMILIES}
    done = subprocess.run([sys.executable, "-c", MEGATRON_CONFIG], input=json.dumps(hf), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])
    for family, config in built.items():
        args = megatron_args(hf[family], "config.json", Facts(None, None, "float32"))
        assert args["group_query_attention"] is True, family
        moe = config["num_moe_experts"] is not None
        assert moe == ("num_experts" in args), family
        for arg, name in TO_CONFIG.items():
            if moe or not arg.startswith(("moe_", "num_experts")):  # a dense model's MoE fields are defaults
                assert args[arg] == config[name], (family, arg, name)


def test_what_a_config_does_not_declare_is_left_out_not_guessed() -> None:
    """A hand-written config without max_position_embeddings, rope_theta or rms_norm_eps (Mixtral's class default
    for rope_theta is not Llama's): those arguments are left out, and the plan's words say so."""
    from migrator.formats.megatron.from_hf import derived

    sparse = {k: v for k, v in _json(_config("llama")).items()
              if k not in ("max_position_embeddings", "rope_parameters", "rope_theta", "rms_norm_eps")}
    args = megatron_args(sparse, "config.json")
    assert not {"max_position_embeddings", "rotary_base", "norm_epsilon", "layernorm_epsilon"} & set(args)
    assert args["num_layers"] == 2
    assert derived(args, "config.json").endswith(
        "left out, the config does not declare them: max_position_embeddings (max_position_embeddings), "
        "rotary_base (rope_theta), norm_epsilon (rms_norm_eps), layernorm_epsilon (rms_norm_eps)")
    with pytest.raises(PlanError, match=r"config\.json: it has no hidden_size"):
        megatron_args({k: v for k, v in sparse.items() if k != "hidden_size"}, "config.json")


def test_a_config_the_written_tensors_contradict_is_refused(tmp_path: Path) -> None:
    """Layers cut by a recipe while config.json still says 2: refused, naming both (give the new model's config)."""
    _tiny_llama(tmp_path / "llama")
    recipe = tmp_path / "cut.yaml"
    recipe.write_text(RECIPE.read_text().replace("remap:", "filter:\n  exclude: [{regex: 'layers\\.1\\.'}]\nremap:", 1))
    run = migrate_in_process("run", str(recipe), "--source", str(tmp_path / "llama"), "--target",
                             f"{tmp_path / 'out'}/", "--no-progress")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "num_hidden_layers 2, but the decoder.layers tensors stack 1" in run.stderr.splitlines()[0]
    assert not (tmp_path / "out").exists()

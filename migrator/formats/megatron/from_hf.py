"""Megatron-LM's training arguments for a Hugging Face model, from its config.json: the `args` a
`torch_dist` target's `common.pt` holds, so Megatron-LM (`--use-checkpoint-args`) and migrator's own
Megatron readers (`${config.KEY}`, `target.hf_config`) find the model's sizes in the checkpoint.

`ARGS` is the table: each row one argument, the config.json key it comes from (what the plan and the
docs say), and its rule. It is the inverse of `formats.torch_dist.hf_config` (arguments -> config.json)
for the families that module makes: Llama, Qwen2, Qwen3, Mixtral and Qwen3-MoE (a test checks each
family both ways). A setting Megatron's arguments cannot express (another activation, a sliding window,
a RoPE scaling other than Llama 3's, experts in some layers only, biases on attention but not on the
MLP) is refused by name, never dropped.

The names are Megatron-LM's as megatron-core 0.16 saves them (`norm_epsilon`; from 2026 Megatron-LM's
arguments carry TransformerConfig's `layernorm_epsilon`, written too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.errors import PlanError

FAMILIES = ("llama", "qwen2", "qwen3", "mixtral", "qwen3_moe")
_MOE = ("mixtral", "qwen3_moe")
_QK_NORM = ("qwen3", "qwen3_moe")
CHECKPOINT_VERSION = 3.0
"""What Megatron-LM's `generate_state_dict` saves beside the args: a checkpoint of megatron-core's QKV
layout (below 2.0, Megatron-LM reorders the QKV rows it loads)."""
_SCALING_CONSTANTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""Llama 3's RoPE scaling as megatron-core applies it (`--use-rope-scaling`): only the factor is an argument."""


@dataclass(frozen=True)
class SourceConfig:
    """A source's config.json as a writer is given it (`FormatSpec.source_config`): its object and path."""

    data: Mapping[str, Any]
    path: str


class _Config:
    """A config.json read for the table: values by key, refusing a missing or mistyped one by name."""

    def __init__(self, data: Mapping[str, Any], label: str) -> None:
        self.data, self.label = data, label
        self.family = str(data.get("model_type"))

    def get(self, key: str, default: Any = None) -> Any:
        v = self.data.get(key)
        return default if v is None else v

    def count(self, key: str, default: Any = None) -> int:
        v = self.get(key, default)
        if v is None:
            raise self.bad(f"it has no {key}")
        if type(v) is not int or v < 1:
            raise self.bad(f"{key} is {v!r}, not a positive integer")
        return v

    def number(self, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad(f"{key} is {value!r}, not a number")
        return float(value)

    def rope(self) -> dict[str, Any]:
        """RoPE's settings: transformers 5's `rope_parameters`, else `rope_scaling` with `rope_theta`."""
        params = self.data.get("rope_parameters")
        if isinstance(params, dict):
            return params
        scaling = self.data.get("rope_scaling")
        return {**(scaling if isinstance(scaling, dict) else {}), "rope_theta": self.data.get("rope_theta")}

    def bad(self, message: str) -> PlanError:
        return PlanError(f"the Megatron arguments of a torch_dist target (common.pt): {self.label}: {message}")


FAMILY, WRITTEN = "family", "written"
"""An `Arg.source` that is no config key: fixed by the model's family, or said by what is written."""


@dataclass(frozen=True)
class Arg:
    """One argument: `name` (Megatron-LM's), `source` (the config.json key it is read from, or `FAMILY`,
    `WRITTEN`), `rule` (its value; None leaves the argument out)."""

    name: str
    source: str
    rule: Callable[[_Config, Facts], Any]
    optional: bool = False
    """Left out (and said so) when the config does not declare its key: not guessed from a class default."""


@dataclass(frozen=True)
class Facts:
    """What the written tensors say beside the config: the embedding's rows, whether an output layer is
    written, the floating dtype every weight shares; None where they do not say (no embedding, mixed dtypes)."""

    vocab_rows: int | None
    output_layer: bool | None
    dtype: str | None
    layers: int | None = None
    """The length of the stacked `decoder.layers` axis."""
    hidden: int | None = None
    """The embedding's columns."""


def _theta(c: _Config, f: Facts) -> float | int | None:
    given = c.rope().get("rope_theta")
    if given is None:
        return None
    theta = c.number("rope_theta", given)
    return int(theta) if theta.is_integer() else theta  # Megatron-LM's --rotary-base is an int


def _scaling(c: _Config) -> float | None:
    """Llama 3's RoPE scaling factor, None without scaling; another kind is refused."""
    rope = c.rope()
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise c.bad(f"RoPE scaling '{kind}': Megatron's arguments express Llama 3's only (--use-rope-scaling)")
    for key, want in _SCALING_CONSTANTS.items():
        if rope.get(key) is None or c.number(key, rope[key]) != want:
            raise c.bad(f"RoPE scaling llama3 with {key} {rope.get(key)!r}: megatron-core applies {want}")
    return c.number("factor", rope.get("factor"))


def _agrees(c: _Config, key: str, written: int | None, what: str) -> int:
    """The config's count, refused when what is written says another (a recipe cut layers: give its config)."""
    value = c.count(key)
    if written is not None and written != value:
        raise c.bad(f"{key} {value}, but {what} {written}: give the config.json of the model written "
                    "(the recipe's config:)")
    return value


def _epsilon(c: _Config) -> float | None:
    given = c.get("rms_norm_eps")
    return None if given is None else c.number("rms_norm_eps", given)


def _dtype(c: _Config, f: Facts) -> str:
    if f.dtype is not None:  # what is written: a recipe's cast made the config's torch_dtype stale
        return f.dtype
    given = c.get("torch_dtype", c.get("dtype", "float32"))
    if given not in ("float32", "bfloat16", "float16"):
        raise c.bad(f"torch_dtype {given!r}: Megatron trains float32, bfloat16 or float16 parameters")
    return str(given)


def _vocab_rows(c: _Config, f: Facts) -> int:
    vocab = c.count("vocab_size")
    rows = vocab if f.vocab_rows is None else f.vocab_rows
    if rows < vocab:
        raise c.bad(f"vocab_size {vocab}, but embedding.word_embeddings.weight has {rows} rows")
    return rows


def _untied(c: _Config, f: Facts) -> bool:
    # absent: what is written says (the families' configs default to untied)
    tied = c.get("tie_word_embeddings", False if f.output_layer is None else not f.output_layer)
    if not isinstance(tied, bool):
        raise c.bad(f"tie_word_embeddings is {tied!r}, not true or false")
    if f.output_layer is not None and tied == f.output_layer:
        raise c.bad(f"tie_word_embeddings is {str(tied).lower()}, but output_layer.weight is "
                    f"{'written' if f.output_layer else 'not written'}")
    return not tied


def _bias(c: _Config) -> tuple[bool, bool]:
    """(add_bias_linear, add_qkv_bias)."""
    attention, mlp = bool(c.get("attention_bias", False)), bool(c.get("mlp_bias", False))
    if c.family == "qwen2":  # q, k and v carry biases, o_proj and the MLP none
        return False, True
    if attention != mlp:
        raise c.bad(f"attention_bias {str(attention).lower()} with mlp_bias {str(mlp).lower()}: Megatron puts "
                    "biases on every linear layer (add_bias_linear) or on q, k and v only (add_qkv_bias)")
    return attention, attention


def _experts(c: _Config, f: Facts) -> int | None:
    if c.family not in _MOE:
        return None
    return c.count("num_local_experts", c.get("num_experts"))


def _moe(rule: Callable[[_Config], Any]) -> Callable[[_Config, Facts], Any]:
    return lambda c, f: rule(c) if c.family in _MOE else None


ARGS: tuple[Arg, ...] = (
    Arg("num_layers", "num_hidden_layers", lambda c, f: _agrees(c, "num_hidden_layers", f.layers,
                                                                "the decoder.layers tensors stack")),
    Arg("hidden_size", "hidden_size", lambda c, f: _agrees(c, "hidden_size", f.hidden,
                                                           "embedding.word_embeddings.weight's columns are")),
    Arg("ffn_hidden_size", "intermediate_size", lambda c, f: c.count("intermediate_size")),
    Arg("num_attention_heads", "num_attention_heads", lambda c, f: c.count("num_attention_heads")),
    Arg("group_query_attention", "num_key_value_heads", lambda c, f: True),  # the groups are always given
    Arg("num_query_groups", "num_key_value_heads",
        lambda c, f: c.count("num_key_value_heads", c.get("num_attention_heads"))),
    Arg("kv_channels", "head_dim",
        lambda c, f: c.count("head_dim", c.count("hidden_size") // c.count("num_attention_heads"))),
    Arg("max_position_embeddings", "max_position_embeddings",
        lambda c, f: c.count("max_position_embeddings") if c.get("max_position_embeddings") is not None else None,
        optional=True),
    Arg("vocab_size", "vocab_size", lambda c, f: c.count("vocab_size")),
    Arg("rotary_base", "rope_theta", _theta, optional=True),
    Arg("rotary_percent", "partial_rotary_factor",
        lambda c, f: c.number("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))),
    Arg("use_rope_scaling", "rope_scaling", lambda c, f: _scaling(c) is not None),  # Llama 3's only
    Arg("rope_scaling_factor", "rope_scaling.factor", lambda c, f: _scaling(c)),
    Arg("norm_epsilon", "rms_norm_eps", lambda c, f: _epsilon(c), optional=True),
    Arg("layernorm_epsilon", "rms_norm_eps", lambda c, f: _epsilon(c), optional=True),
    Arg("swiglu", "hidden_act", lambda c, f: True),  # silu, else refused
    Arg("untie_embeddings_and_output_weights", "tie_word_embeddings", _untied),  # negated; output_layer agrees
    Arg("add_bias_linear", "attention_bias, mlp_bias", lambda c, f: _bias(c)[0]),
    Arg("add_qkv_bias", "attention_bias", lambda c, f: _bias(c)[1]),  # always for qwen2
    Arg("num_experts", "num_local_experts", _experts),  # or num_experts
    Arg("moe_router_topk", "num_experts_per_tok", _moe(lambda c: c.count("num_experts_per_tok"))),
    Arg("moe_ffn_hidden_size", "moe_intermediate_size",  # Mixtral: intermediate_size
        _moe(lambda c: c.count("moe_intermediate_size", c.get("intermediate_size")))),
    Arg("moe_router_pre_softmax", "norm_topk_prob",  # negated; Mixtral renormalizes the top-k
        _moe(lambda c: not c.get("norm_topk_prob", True))),
    Arg("moe_aux_loss_coeff", "router_aux_loss_coef",
        _moe(lambda c: c.number("router_aux_loss_coef", c.get("router_aux_loss_coef", 0.0)))),
    Arg("moe_layer_freq", "decoder_sparse_step", _moe(lambda c: 1)),  # experts in every layer, else refused
    # fixed by the family (model_type)
    Arg("position_embedding_type", FAMILY, lambda c, f: "rope"),
    Arg("add_position_embedding", FAMILY, lambda c, f: False),  # no learned position table
    Arg("rotary_interleaved", FAMILY, lambda c, f: False),  # RoPE rotates halves, not pairs
    Arg("normalization", FAMILY, lambda c, f: "RMSNorm"),
    Arg("qk_layernorm", FAMILY, lambda c, f: c.family in _QK_NORM),
    # what is written
    Arg("padded_vocab_size", WRITTEN, _vocab_rows),  # the embedding's rows: vocab_size and any padding
    Arg("make_vocab_size_divisible_by", WRITTEN, lambda c, f: 1),  # the vocabulary is written as it is
    Arg("params_dtype", WRITTEN, _dtype),  # the weights' dtype, else torch_dtype
    Arg("bf16", WRITTEN, lambda c, f: _dtype(c, f) == "bfloat16"),
    Arg("fp16", WRITTEN, lambda c, f: _dtype(c, f) == "float16"),
    Arg("tensor_model_parallel_size", WRITTEN, lambda c, f: 1),  # each tensor one whole chunk
    Arg("pipeline_model_parallel_size", WRITTEN, lambda c, f: 1),
    Arg("ckpt_format", WRITTEN, lambda c, f: "torch_dist"),
)
"""Megatron-LM's argument <- the config.json key it comes from, and how."""
DTYPE_ARGS = ("params_dtype",)
"""Arguments holding a torch dtype (pickled as `torch.<name>`, as Megatron-LM saves them)."""


def _refusals(c: _Config) -> list[str]:
    """What the families' configs may hold that Megatron's arguments cannot express."""
    out = []
    act = c.get("hidden_act", c.get("hidden_activation", "silu"))
    if act != "silu":
        out.append(f"hidden_act {act} (Megatron's gated MLP is SwiGLU)")
    if c.get("use_sliding_window") or (c.family in ("llama", "mixtral") and c.get("sliding_window")):
        out.append("a sliding attention window")
    if c.family in _QK_NORM and c.get("attention_bias"):
        out.append("attention_bias on a model with q/k norms")
    if c.family == "qwen3_moe" and (c.get("decoder_sparse_step", 1) != 1 or c.get("mlp_only_layers")):
        out.append("experts in some layers only (decoder_sparse_step, mlp_only_layers)")
    return out


def megatron_args(config: Mapping[str, Any], label: str, facts: Facts = Facts(None, None, None)) -> dict[str, Any]:
    """The arguments `ARGS` derives from `config` (a config.json's object, `label` naming it) for the tensors
    written (`facts`); PlanError naming what the arguments cannot express or the tensors contradict."""
    c = _Config(config, label)
    if c.family not in FAMILIES:
        raise c.bad(f"model_type {config.get('model_type')!r}: arguments are derived for {', '.join(FAMILIES)} "
                    "(give a config.json of one, or none: common.pt then holds no arguments)")
    refused = _refusals(c)
    if refused:
        raise c.bad(f"Megatron's arguments cannot express {'; '.join(refused)}")
    out = {}
    for arg in ARGS:
        value = arg.rule(c, facts)
        if value is not None:
            out[arg.name] = value
    return out


def derived(args: Mapping[str, Any], label: str) -> str:
    """What the arguments are and where each comes from, as the plan says it; which were left out."""
    sources = {a.name: a.source for a in ARGS}
    groups: dict[str, list[str]] = {}
    for k, v in args.items():
        source = sources.get(k, WRITTEN)
        shown = f"{k} {v}" + (f" ({source})" if source not in (k, FAMILY, WRITTEN) else "")
        groups.setdefault(source if source in (FAMILY, WRITTEN) else "", []).append(shown)
    left = [f"{a.name} ({a.source})" for a in ARGS if a.optional and a.name not in args]
    return (f"from {label}: {', '.join(groups.get('', []))}; by model_type: "
            f"{', '.join(groups.get(FAMILY, []))}; from what is written: {', '.join(groups.get(WRITTEN, []))}"
            + (f"; left out, the config does not declare them: {', '.join(left)}" if left else ""))


def torch_dtype_of(dtypes: Sequence[str]) -> str | None:
    """The one floating dtype the written weights share ("bfloat16"), None when they do not share one."""
    found = set(dtypes)
    return next(iter(found)) if len(found) == 1 and found <= {"float32", "bfloat16", "float16"} else None

"""A PEFT LoRA adapter as a GGUF LoRA adapter: what llama.cpp's `convert_lora_to_gguf.py` writes, as
recipe data (remaps, ops, a cast, key/values) for `migrate convert ADAPTER_DIR adapter.gguf`.

llama.cpp applies an adapter to a base GGUF at load time: each targeted weight `W` (llama.cpp's name,
`blk.N.attn_q.weight`) gets two tensors, `W.lora_a` (PEFT's lora_A, [r, in]) and `W.lora_b` (lora_B,
[out, r]), and its output gains `alpha / r * B A x`, r read from `lora_b`. So the names are the base
model's GGUF names (`llama.REMAPS`) plus the suffix, and every transform the model converter applies
to `W` is applied to the factor it acts on: for llama, q and k are permuted into the interleaved
rotary layout by rows, which are B's rows (A is unchanged). An embedding's factors are PEFT's
`lora_embedding_A` [r, vocab] transposed (llama.cpp looks its rows up by token) and
`lora_embedding_B` [hidden, r]. The adapter's `lora_alpha` is `adapter.lora.alpha` (FLOAT32),
and every tensor is written F32 unless a cast says otherwise (the converter's default `--outtype
f32`).

Everything is checked from headers before a byte is written: the base model's `config.json` names
an architecture the model converter knows, and each factor pair fits the base weight it targets
(`out` and `in` of the base's tensor: an adapter trained on another model is refused). What llama.cpp
cannot hold is refused by name: DoRA, trained biases, per-module alphas, full modules saved in the
adapter (`modules_to_save`, resized embeddings), a module with no llama.cpp name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ...core.errors import AdapterError
from .llama import NORM_OFFSET, PERMUTED, REMAPS, architecture, config_problem

PREFIX = "base_model.model."
_COPY = ".base_layer.weight"
_PART = re.compile(r"^(?P<module>.+)\.(?:(?P<linear>lora_[AB])\.weight|(?P<embedding>lora_embedding_[AB]))$")
# what, set (truthy) in adapter_config.json, makes an adapter llama.cpp's `alpha / r * B A` cannot express
_REFUSED = {
    "use_dora": "DoRA (a magnitude per output row)",
    "lora_bias": "trained LoRA biases",
    "alpha_pattern": "per-module alphas (llama.cpp has one adapter.lora.alpha)",
    "modules_to_save": "modules trained in full (GGUF adapters hold only lora_a / lora_b pairs)",
    "layer_replication": "layer replication",
    "trainable_token_indices": "trained token rows",
    "alora_invocation_tokens": "activated LoRA",
    "use_qalora": "QALoRA",
    "fan_in_fan_out": "Conv1D (fan_in_fan_out) weights",
    "target_parameters": "target_parameters",
}


def check_config(raw: Any, where: str) -> dict[str, Any]:
    """`adapter_config.json` checked for what a GGUF adapter can hold (AdapterError naming the key)."""
    if not isinstance(raw, dict):
        raise AdapterError("adapter config must be a JSON object", file=where)
    if raw.get("peft_type") != "LORA":
        raise AdapterError(f"peft_type {raw.get('peft_type')!r}: llama.cpp's adapters are LoRA (peft_type LORA)",
                           file=where)
    if raw.get("bias", "none") != "none":
        raise AdapterError(f"bias {raw['bias']!r}: llama.cpp's adapters hold no biases (only bias: none)", file=where)
    for key, what in _REFUSED.items():
        if raw.get(key):
            raise AdapterError(f"{key} is set: {what} cannot be written as a GGUF LoRA adapter", file=where)
    r, alpha = raw.get("r"), raw.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        raise AdapterError(f"r must be a positive integer, got {r!r}", file=where)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise AdapterError(f"lora_alpha must be a finite number, got {alpha!r}", file=where)
    ranks = raw.get("rank_pattern") or {}
    if not isinstance(ranks, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                              for v in ranks.values()):
        raise AdapterError("rank_pattern must map module patterns to positive integer ranks", file=where)
    if raw.get("use_rslora") and set(ranks.values()) - {r}:
        raise AdapterError("use_rslora with a rank_pattern: rsLoRA's alpha / sqrt(r) differs per rank, and "
                           "llama.cpp has one adapter.lora.alpha", file=where)
    return raw


def gguf_alpha(config: Mapping[str, Any]) -> float:
    """The `adapter.lora.alpha` llama.cpp needs: it scales by alpha / r, so rsLoRA's alpha / sqrt(r) is
    alpha x sqrt(r) there (one rank throughout: `check_config`)."""
    alpha = float(config["lora_alpha"])
    return alpha * math.sqrt(int(config["r"])) if config.get("use_rslora") else alpha


def _gguf_name(hf_weight: str, arch: str) -> str | None:
    """llama.cpp's name of a Hugging Face weight (`model.layers.0.self_attn.q_proj.weight`), else None."""
    for pattern, repl in REMAPS[arch]:
        if re.match(pattern, hf_weight):
            return re.sub(pattern, repl.replace("$1", r"\g<1>"), hf_weight, count=1)
    return None


def lora_recipe(config: Mapping[str, Any], base_config: dict[str, Any], adapter_shapes: Mapping[str, tuple[int, ...]],
                base_shapes: Mapping[str, tuple[int, ...]], *, adapter: str, base: str) -> dict[str, Any]:
    """Recipe data (exclude, remap, ops, metadata) writing the adapter's tensors as llama.cpp's LoRA
    adapter of `base` (its config.json and its weights' shapes). AdapterError, in one line naming the
    tensor or key, for what cannot be written."""
    arch = architecture(base_config)
    if arch is None:
        named = base_config.get("architectures") or base_config.get("model_type")
        raise AdapterError(f"the base model is {named!r}: GGUF LoRA adapters are written for the architectures "
                           f"migrator converts to GGUF ({', '.join(sorted(REMAPS))})", file=f"{base}/config.json")
    problem = config_problem(base_config)
    if problem is not None:
        raise AdapterError(problem, file=f"{base}/config.json")
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    embedding: set[str] = set()
    names: dict[str, str] = {}  # module -> GGUF name of its weight
    copies = []  # PEFT's save_embedding_layers: the base's own embedding saved beside its factors
    for name, shape in adapter_shapes.items():
        if name.startswith(PREFIX) and name.endswith(_COPY):
            weight = name[len(PREFIX):-len(_COPY)] + ".weight"
            if tuple(base_shapes.get(weight, ())) != tuple(shape):
                raise AdapterError(f"'{name}' ({list(shape)}) is not the base's '{weight}' "
                                   f"({list(base_shapes.get(weight, ()))}): a resized embedding cannot be a GGUF "
                                   "LoRA adapter", file=adapter)
            copies.append(name)
            continue
        found = _PART.match(name[len(PREFIX):]) if name.startswith(PREFIX) else None
        if found is None:
            raise AdapterError(f"'{name}' is not a LoRA factor (lora_A / lora_B): a GGUF LoRA adapter holds only "
                               "those", file=adapter)
        module, part = found["module"], (found["linear"] or found["embedding"])[-1]
        if found["embedding"]:
            embedding.add(module)
        gguf = _gguf_name(module + ".weight", arch)
        if gguf is None or (module == "lm_head" and arch in NORM_OFFSET):
            raise AdapterError(f"'{name}': llama.cpp's {arch} has no tensor for module '{module}' (target_modules "
                               "must be modules of the model the GGUF converter names)", file=adapter)
        names[module] = gguf
        if len(shape) != 2:
            raise AdapterError(f"'{name}' has shape {list(shape)}: LoRA factors are matrices", file=adapter)
        pairs.setdefault(module, {})[part] = shape
    for module, parts in pairs.items():
        if set(parts) != {"A", "B"}:
            missing = "lora_B" if "A" in parts else "lora_A"
            raise AdapterError(f"module '{module}' has no {missing}", file=adapter)
        (ra, cols), (rows, rb) = parts["A"], parts["B"]
        weight = module + ".weight"
        if ra != rb:
            raise AdapterError(f"module '{module}': lora_A has rank {ra} and lora_B {rb}", file=adapter)
        expected = (cols, rows) if module in embedding else (rows, cols)
        if weight not in base_shapes:
            tied = " (the base ties it to the embedding)" if module == "lm_head" else ""
            raise AdapterError(f"module '{module}': the base model has no '{weight}'{tied}", file=adapter)
        if tuple(base_shapes[weight]) != expected:
            raise AdapterError(f"module '{module}': the factors make a {list(expected)} delta, but the base's "
                               f"'{weight}' is {list(base_shapes[weight])} (an adapter of another model?)",
                               file=adapter)
    remap = []
    for pattern, repl in REMAPS[arch]:
        hf = r"^" + re.escape(PREFIX) + pattern.lstrip("^")
        remap += [{"from": hf + r"lora_A\.weight$", "to": repl + "weight.lora_a"},
                  {"from": hf + r"lora_B\.weight$", "to": repl + "weight.lora_b"}]
        if "embed_tokens" in pattern:
            remap += [{"from": hf.removesuffix(r"\.") + r"\.lora_embedding_A$", "to": repl + "weight.lora_a"},
                      {"from": hf.removesuffix(r"\.") + r"\.lora_embedding_B$", "to": repl + "weight.lora_b"}]
    factors = [n for n in adapter_shapes if n not in copies]
    remap = [rule for rule in remap if any(re.search(rule["from"], n) for n in factors)]  # the rules used
    written = {g + suffix for g in names.values() for suffix in (".lora_a", ".lora_b")}
    ops: list[dict[str, Any]] = []
    if arch in PERMUTED:  # the rows of q and k move into the interleaved rotary layout: B's rows
        heads = int(base_config["num_attention_heads"])
        kv_heads = int(base_config.get("num_key_value_heads") or heads)
        for which, count in (("q", heads), ("k", kv_heads)):
            pattern = rf"blk\.\d+\.attn_{which}\.weight\.lora_b"
            if any(re.fullmatch(pattern, n) for n in written):
                ops.append({"rope_permute": {"from": pattern, "heads": count, "inverse": True}})
    if embedding:  # llama.cpp gathers A's rows by token: [vocab, r]
        ops.append({"permute": {"from": r"token_embd\.weight\.lora_a", "dims": [1, 0]}})
    return {
        # llama.cpp adds the factors to its base's own weights, as convert_lora_to_gguf.py leaves the copies out
        "exclude": [r"^" + re.escape(c) + "$" for c in copies],
        "remap": remap,
        "ops": ops,
        "metadata": {"general.architecture": arch, "general.type": "adapter", "adapter.type": "lora",
                     "adapter.lora.alpha": repr(gguf_alpha(config))},
    }

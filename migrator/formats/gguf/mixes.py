"""llama.cpp's K-quant mixes (`Q4_K_M`, `Q4_K_S`, `Q5_K_M`, `Q5_K_S`, `Q6_K`, `Q3_K_S`, `Q3_K_M`,
`Q3_K_L`, `Q2_K`): each tensor's type.

llama-quantize does not give every tensor the mix's base type: it picks per tensor by its role and
layer, which this module restates for the Llama family (llama, mistral: dense, one attention V and
one FFN down projection per block), so that `--quantize Q4_K_M` writes what llama-quantize writes:

* only tensors of 2+ dimensions whose name ends with `weight` and holds no `_norm.weight` are
  quantized (nor `ffn_gate_inp.weight`, an expert router); the others keep their type (norms and 1-D
  tensors are F32 in every GGUF the writer makes);
* `output.weight` (and `token_embd.weight` when there is no `output.weight`: tied embeddings) is
  Q6_K, or Q8_0 when its rows are not whole 256-value blocks;
* `attn_v.weight`: Q6_K in the `use_more_bits` layers for Q4_K_M/Q5_K_M, Q5_K in the first 4 for
  Q4_K_S, Q5_K in the first 2 (else Q4_K) for Q3_K_M, Q5_K for Q3_K_L, Q4_K (with 4+ query heads per
  KV head) or Q3_K for Q2_K, and at least Q5_K in a 70B Llama (80 blocks, grouped-query attention)
  where the choice was Q3_K or Q4_K;
* `ffn_down`: Q6_K in the `use_more_bits` layers for Q4_K_M/Q5_K_M, Q5_K in the first eighth of the
  layers for Q4_K_S, Q5_K in the first sixteenth (else Q4_K) for Q3_K_M, Q5_K for Q3_K_L, Q3_K for Q2_K;
* `attn_output.weight`: Q4_K for Q3_K_M, Q5_K for Q3_K_L, Q3_K for Q2_K;
* everything else: the base type;
* then, as llama.cpp does for any type, a tensor whose rows are not whole blocks of the chosen type
  falls back: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0, and F16 when its rows are not
  whole 32-value blocks either (`fallback`).

`use_more_bits(i, n)`: the first and last eighth of the layers and every third one in between.
Layers are counted in llama.cpp's order (block number, then name), which for these architectures is
the block number. `general.file_type` is llama.cpp's number for the mix (`FILE_TYPES`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .constants import BY_NAME

BASE_TYPES: dict[str, str] = {"Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K", "Q5_K_M": "Q5_K", "Q5_K_S": "Q5_K", "Q6_K": "Q6_K",
                              "Q3_K_S": "Q3_K", "Q3_K_M": "Q3_K", "Q3_K_L": "Q3_K", "Q2_K": "Q2_K"}
"""The mixes, with the type of the tensors no rule changes."""
FILE_TYPES: dict[str, int] = {"Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
                              "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18}
"""llama_ftype of each mix (`general.file_type`)."""
FALLBACKS: dict[str, str] = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
"""llama.cpp's type for a tensor whose rows are not whole 256-value blocks."""
_LAYER = re.compile(r"blk\.(\d+)\.")
_ATTN_V = ("attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight")


def is_mix(name: str) -> bool:
    return name.upper() in BASE_TYPES


def fallback(gtype: str, row: int) -> str:
    """The type llama.cpp writes for rows of `row` values chosen as `gtype`: itself when the rows are
    whole blocks, else the K-quant's fallback, else F16."""
    if row % BY_NAME[gtype].block_size == 0:
        return gtype
    smaller = FALLBACKS.get(gtype)
    return smaller if smaller is not None and row % BY_NAME[smaller].block_size == 0 else "F16"


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def quantized_by_llama_cpp(name: str, shape: Sequence[int]) -> bool:
    """Whether llama-quantize quantizes this tensor (else it keeps the type it has)."""
    return (len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name)


def _layer(name: str) -> int:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def mix_types(mix: str, tensors: Sequence[tuple[str, Sequence[int]]],
              metadata: Mapping[str, object] | None = None) -> dict[str, str]:
    """The ggml type of each tensor llama-quantize quantizes under `mix`, by name (tensors it keeps as
    they are are left out). `tensors` are (name, shape) in PyTorch order (rows last); `metadata` the
    file's key/values (the architecture, block count and head counts, for the 70B rule)."""
    meta = {k: str(v) for k, v in (metadata or {}).items()}
    mix = mix.upper()
    base = BASE_TYPES[mix]
    ordered = sorted(((n, s) for n, s in tensors if quantized_by_llama_cpp(n, s)), key=lambda t: (_layer(t[0]), t[0]))
    names = {n for n, _ in tensors}
    tied = "output.weight" not in names
    n_attn_v = sum(1 for n, _ in ordered if any(k in n for k in _ATTN_V))
    arch = meta.get("general.architecture", "llama")
    n_layer = int(meta.get(f"{arch}.block_count", 0) or 0) or 1 + max((_layer(n) for n in names), default=-1)
    heads, kv_heads = meta.get(f"{arch}.attention.head_count"), meta.get(f"{arch}.attention.head_count_kv")
    is_70b = arch == "llama" and n_layer == 80 and heads is not None and kv_heads not in (None, heads)
    gqa = int(heads) // int(kv_heads) if heads and kv_heads and int(kv_heads) else 1
    i_attn_v = i_ffn_down = 0
    out: dict[str, str] = {}
    for name, shape in ordered:
        row = shape[-1]
        chosen = base
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            chosen = "Q8_0" if row % BY_NAME[base].block_size else "Q6_K"
        elif name == "token_embd.weight":
            pass
        elif any(k in name for k in _ATTN_V):
            if mix in ("Q4_K_M", "Q5_K_M") and use_more_bits(i_attn_v, n_attn_v):
                chosen = "Q6_K"
            elif mix == "Q4_K_S" and i_attn_v < 4:
                chosen = "Q5_K"
            elif mix == "Q3_K_M":
                chosen = "Q5_K" if i_attn_v < 2 else "Q4_K"
            elif mix == "Q3_K_L":
                chosen = "Q5_K"
            elif mix == "Q2_K":
                chosen = "Q4_K" if gqa >= 4 else "Q3_K"
            if is_70b and chosen in ("Q3_K", "Q4_K"):
                chosen = "Q5_K"
            i_attn_v += 1
        elif "ffn_down" in name:
            if mix in ("Q4_K_M", "Q5_K_M") and use_more_bits(i_ffn_down, n_layer):
                chosen = "Q6_K"
            elif mix == "Q4_K_S" and i_ffn_down < n_layer // 8:
                chosen = "Q5_K"
            elif mix == "Q3_K_M":
                chosen = "Q5_K" if i_ffn_down < n_layer // 16 else "Q4_K"
            elif mix == "Q3_K_L":
                chosen = "Q5_K"
            elif mix == "Q2_K":
                chosen = "Q3_K"
            i_ffn_down += 1
        elif "attn_output.weight" in name:
            chosen = {"Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "Q2_K": "Q3_K"}.get(mix, base)
        out[name] = fallback(chosen, row)
    return out


def describe(types: Mapping[str, str]) -> str:
    """The chosen types by tensor group, for the plan: `blk.N.attn_v.weight Q6_K in blocks 2, 4, else Q4_K`."""
    groups: dict[str, dict[str, list[int]]] = {}
    for name, gtype in types.items():
        layer = _layer(name)
        group = _LAYER.sub("blk.N.", name, count=1) if layer >= 0 else name
        groups.setdefault(group, {}).setdefault(gtype, []).append(layer)
    parts = []
    for group, by_type in groups.items():
        ranked = sorted(by_type.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        if len(ranked) == 1 or group == ranked[0][0]:
            parts.append(f"{group} {ranked[0][0]}")
            continue
        rest = "; ".join(f"{gtype} in blocks {', '.join(map(str, sorted(layers)))}" for gtype, layers in ranked[1:])
        parts.append(f"{group} {rest}, else {ranked[0][0]}")
    return ", ".join(parts)


# dense architectures whose every mix is llama-quantize's, type for type and byte for byte (its rules name
# no one of them: tests/formats/test_gguf_llamacpp.py checks each)
CHECKED_ARCHITECTURES = ("llama", "qwen2", "phi3", "gemma", "gemma2", "gemma3")


def caveat(metadata: Mapping[str, object]) -> str | None:
    """Why llama-quantize may choose other types for this model than `mix_types` does, or None."""
    meta = {k: str(v) for k, v in metadata.items()}
    arch = meta.get("general.architecture")
    experts = int(meta.get(f"{arch}.expert_count", "0") or 0)
    if experts > 1:
        return (f"the mix follows llama-quantize's rules for dense models; for this {experts}-expert model it "
                "chooses some types differently (e.g. attn_k/attn_v Q8_0 for 8 experts)")
    if arch not in (None, *CHECKED_ARCHITECTURES):
        return f"the mix follows llama-quantize's rules for the llama architecture; for {arch} some may differ"
    return None

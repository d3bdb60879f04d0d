"""How Megatron divides each tensor between tensor-parallel ranks, and the names it is read under: data.

Megatron's tensor parallelism is decided by each layer's class, which a checkpoint does not record: a
column-parallel linear (`ColumnParallelLinear`: QKV, the MLP's first projection, the output layer)
splits its output rows, a row-parallel one (`RowParallelLinear`: the attention's and the MLP's output
projections) its input columns, the vocab-parallel embedding its vocabulary rows, and norms and a
row-parallel layer's bias are whole on every rank. `SPLITS` says so per name, first match wins;
`tests/formats/test_megatron_legacy_mcore.py` checks it against the `partition_dim` megatron-core itself
sets on its layers' parameters. A name no rule matches is refused when there are several ranks to join.

Pre-megatron-core checkpoints (`language_model.encoder.layers.N.self_attention.query_key_value`, nested
dicts) name the same tensors otherwise; `OLD_NAMES` renames them to megatron-core's local-layer names, so
one recipe reads both (the reader's notes say it did).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

SplitKind = Literal["rows", "columns", "replicated", "skip"]


@dataclass(frozen=True)
class Split:
    """How one tensor is divided: `rows` (dim 0, each rank a consecutive block), `columns` (dim 1),
    `replicated` (whole on every rank: rank 0's is read, every rank's shape checked), `skip` (not a
    weight). `gated`: with a gated MLP (SwiGLU, `args.swiglu`) each rank's rows are its own
    `[gate_r; up_r]`, re-interleaved into the global `[gate; up]`."""

    kind: SplitKind
    why: str
    gated: bool = False

    @property
    def dim(self) -> int | None:
        return 0 if self.kind == "rows" else 1 if self.kind == "columns" else None


_ROWS_COLUMN_PARALLEL = Split("rows", "column-parallel linear: each rank holds a block of output rows")
_COLUMNS = Split("columns", "row-parallel linear: each rank holds a block of input columns")
_REPLICATED = Split("replicated", "whole on every tensor-parallel rank")

SPLITS: tuple[tuple[re.Pattern[str], Split], ...] = tuple((re.compile(p), s) for p, s in (
    (r"\._extra_state$", Split("skip", "Transformer Engine's FP8 bookkeeping, not a weight")),
    (r"(^|\.)word_embeddings\.weight$", Split("rows", "vocab-parallel embedding: each rank holds a block of "
                                                      "vocabulary rows (padded_vocab_size in all)")),
    (r"(^|\.)output_layer\.weight$", Split("rows", "column-parallel output layer: vocabulary rows")),
    (r"\.linear_qkv\.(weight|bias)$", Split("rows", "column-parallel QKV: each rank holds whole query groups "
                                                    "([q of the group; k; v] per group)")),
    (r"\.linear_fc1\.(weight|bias)$", Split("rows", "column-parallel first MLP projection", gated=True)),
    (r"\.linear_(qkv|fc1)\.layer_norm_(weight|bias)$", Split("replicated", "a norm fused into the linear "
                                                                           "(Transformer Engine)")),
    (r"\.linear_(proj|fc2)\.weight$", _COLUMNS),
    (r"\.linear_(proj|fc2)\.bias$", Split("replicated", "row-parallel bias: added once, after the reduction")),
    (r"(^|\.)(input_layernorm|pre_mlp_layernorm|final_layernorm|q_layernorm|k_layernorm|"
     r"post_self_attn_layernorm|pre_cross_attn_layernorm)\.(weight|bias)$", _REPLICATED),
    (r"(^|\.)position_embeddings\.weight$", Split("replicated", "learned absolute positions: not divided")),
    (r"\.router\.(weight|bias|expert_bias)$", Split("replicated", "MoE router: whole on every rank")),
))
"""(pattern on the megatron-core name, how it is split); the first match wins."""

OLD_NAMES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), t) for p, t in (
    (r"^language_model\.embedding\.", "embedding."),
    (r"^language_model\.(?:encoder|transformer)\.final_(?:layernorm|norm)\.", "decoder.final_layernorm."),
    (r"^language_model\.(?:encoder|transformer)\.layers\.", "decoder.layers."),
    (r"^language_model\.output_layer\.", "output_layer."),
    (r"^word_embeddings_for_head\.", "output_layer."),  # the last stage's copy of tied embeddings
))
"""Pre-megatron-core prefixes (pattern, replacement); a name renamed by one also has its layer parts renamed."""

OLD_LAYER_PARTS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), t) for p, t in (
    (r"\.self_attention\.query_key_value\.", ".self_attention.linear_qkv."),
    (r"\.self_attention\.dense\.", ".self_attention.linear_proj."),
    (r"\.post_attention_layernorm\.", ".pre_mlp_layernorm."),
    (r"\.mlp\.dense_h_to_4h\.", ".mlp.linear_fc1."),
    (r"\.mlp\.dense_4h_to_h\.", ".mlp.linear_fc2."),
))
"""Inside a pre-megatron-core layer: its parts under megatron-core's names (same layouts per rank)."""

OLD_NAMES_NOTE = ("pre-megatron-core names read as megatron-core's (language_model.encoder.layers.N."
                  "self_attention.query_key_value -> decoder.layers.N.self_attention.linear_qkv, dense -> "
                  "linear_proj, dense_h_to_4h -> mlp.linear_fc1, dense_4h_to_h -> mlp.linear_fc2, "
                  "post_attention_layernorm -> pre_mlp_layernorm, language_model.embedding -> embedding, "
                  "word_embeddings_for_head -> output_layer)")
"""What the reader's notes say when it renamed older names."""

LAYER = re.compile(r"^(?P<pre>decoder\.layers\.)(?P<index>\d{1,9})(?P<post>\..+)$")
"""A transformer layer's tensor (megatron-core names): its index is the stage's own, from 0."""


def mcore_name(name: str) -> tuple[str, bool]:
    """The megatron-core name of a checkpoint's tensor name, and whether it was an older name."""
    for pattern, replacement in OLD_NAMES:
        new, n = pattern.subn(replacement, name, count=1)
        if n:
            for part, to in OLD_LAYER_PARTS:
                new = part.sub(to, new, count=1)
            return new, True
    return name, False


def split_of(name: str) -> Split | None:
    """How the tensor `name` (a megatron-core name) is divided between tensor-parallel ranks; None: unknown."""
    for pattern, split in SPLITS:
        if pattern.search(name):
            return split
    return None

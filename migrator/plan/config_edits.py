"""What a recipe changes in the config.json copied into a folder target: the entries the written
tensors determine (`vocab_size` from the embedding's rows, the expert count from the routers' rows,
`tie_word_embeddings` false once a head is written from the embedding), and the recipe's own edits
(`target.config`), each checked against the tensors.

Derived entries change only what the source's config already says (a key it does not hold stays
absent: transformers' defaults differ per model). An explicit edit that contradicts the tensors is
refused (a model whose config says 2 experts over routers of 4 rows loads with a shape error, or not
at all, later). `null` removes a key (an expert's MoE keys, once it is extracted as a dense model).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import PlanError
from ..core.tensor import LazyTensor

EMBEDDING = re.compile(r"(?:^|\.)(?:embed_tokens|wte|word_embeddings|tok_embeddings|embed_in)\.weight$")
"""An input embedding's name in the Hugging Face families (Llama, GPT-2, BERT, Meta's, GPT-NeoX)."""
HEAD = re.compile(r"(?:^|\.)(?:lm_head|embed_out)\.weight$")
"""A language model head's name (transformers' `lm_head`, GPT-NeoX's `embed_out`)."""
ROUTER = re.compile(r"\.(?:block_sparse_moe|mlp)\.gate\.weight$")
"""A mixture of experts' router (Mixtral's block_sparse_moe.gate, Qwen-MoE's and DeepSeek's mlp.gate)."""
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
"""Where a config says its expert count: Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3."""


def copies_config(copies: Sequence[tuple[str, bool]]) -> bool:
    return any(fnmatch.fnmatchcase("config.json", pattern) for pattern, _ in copies)


def config_update(edits: Mapping[str, Any], config: Mapping[str, Any], tensors: Sequence[LazyTensor],
                  made_from: Mapping[str, Sequence[str]]) -> tuple[dict[str, Any], list[str]]:
    """The entries to set in the copied config (None: remove the key) and the notes saying the derived
    ones; PlanError, one line, when an edit contradicts the tensors. `made_from`: each written tensor's
    source tensors (as the plan names them)."""
    implied = _implied(tensors, made_from)
    update: dict[str, Any] = dict(edits)
    notes: list[str] = []
    for key, value in edits.items():
        if value is None or key not in implied:
            continue
        want, why = implied[key]
        if key == "tie_word_embeddings":
            if value is False and want is True:
                raise PlanError(f"target.config: tie_word_embeddings: false contradicts the tensors: {why}; clone the "
                                "embedding to the head first (clone: {from: EMBEDDING, to: lm_head.weight})")
            continue
        if type(value) is not int or value != want:
            raise PlanError(f"target.config: {key}: {value!r} contradicts the tensors: {why}")
    for key, (want, why) in implied.items():
        if key in edits or (key == "tie_word_embeddings" and want is not False):
            continue
        if key in config and config[key] != want:
            update[key] = want
            notes.append(f"config.json: {key} {config[key]!r} -> {want!r} ({why})")
    experts = next((update.get(k, config.get(k)) for k in EXPERT_KEYS if k in update or k in config), None)
    per_token = update.get("num_experts_per_tok", config.get("num_experts_per_tok"))
    if type(experts) is int and type(per_token) is int and per_token > experts:
        raise PlanError(f"config.json: num_experts_per_tok {per_token} is more than the {experts} experts kept: "
                        "each token would be routed to experts that do not exist; set target.config: "
                        "{num_experts_per_tok: N} with N <= the experts kept")
    return update, notes


def _implied(tensors: Sequence[LazyTensor], made_from: Mapping[str, Sequence[str]]) -> dict[str, tuple[Any, str]]:
    """key -> (the value the tensors determine, why), for the keys they determine."""
    out: dict[str, tuple[Any, str]] = {}
    rows = [(t.name, t.shape[0]) for t in tensors if len(t.shape) == 2 and (EMBEDDING.search(t.name)
                                                                          or HEAD.search(t.name))]
    if rows and len({n for _, n in rows}) == 1:
        out["vocab_size"] = (rows[0][1], " and ".join(f"'{name}' has {n} rows" for name, n in rows))
    routers = [(t.name, t.shape[0]) for t in tensors if len(t.shape) == 2 and ROUTER.search(t.name)]
    if routers:
        counts = sorted({n for _, n in routers})
        if len(counts) > 1:
            first = {n: name for name, n in routers}
            raise PlanError(f"the routers written have different numbers of experts ('{first[counts[0]]}' "
                            f"{counts[0]}, '{first[counts[-1]]}' {counts[-1]}): one config.json cannot describe them")
        why = f"the routers ('{routers[0][0]}', ...) have {counts[0]} rows"
        for key in EXPERT_KEYS:
            out[key] = (counts[0], why)
    heads = [t.name for t in tensors if HEAD.search(t.name)]
    embeddings = [t.name for t in tensors if EMBEDDING.search(t.name)]
    if embeddings and not heads:
        out["tie_word_embeddings"] = (True, f"no head tensor is written beside '{embeddings[0]}'")
    made = [h for h in heads if any(EMBEDDING.search(s) for s in made_from.get(h, ()))]
    if embeddings and made:  # a head copied from the embedding (clone): a matrix of its own
        out["tie_word_embeddings"] = (False, f"'{made[0]}' is written from the embedding, a head of its own")
    return out


def edited_config(edits: Mapping[str, Any], folder: Path | None, copies: Sequence[tuple[str, bool]],
                  tensors: Sequence[LazyTensor], made_from: Mapping[str, Sequence[str]],
                  notes: list[str]) -> dict[str, Any]:
    """The update for a folder target's copied config.json (read from `folder`); `notes` get the derived
    entries. Edits without a copied config.json are refused."""
    from ..files.model_config import ConfigError, load_config

    if not copies_config(copies) or folder is None or not (folder / "config.json").is_file():
        if edits:
            raise PlanError("target.config edits the config.json copied into the folder target, and none is: add "
                            "copy: [config.json] (from the source's folder, or target.copy_from)")
        return {}
    try:
        config = load_config(folder / "config.json")
    except ConfigError as e:
        if edits:
            raise PlanError(f"target.config: {e}") from None
        return {}
    update, said = config_update(edits, config, tensors, made_from)
    notes += said
    return update

"""Which transformer layers each pipeline stage (and each of its virtual-pipeline chunks) holds, from `args`.

A stage numbers its layers from 0 in its own file (in each chunk `model0`, `model1`, ... under a
virtual pipeline); its first layer is the number of layers before it. Megatron divides `num_layers`
evenly over `pipeline_model_parallel_size` stages, unless `decoder_first_pipeline_num_layers` /
`decoder_last_pipeline_num_layers` give the first or last stage its own count (the rest then divided
evenly). With a virtual pipeline of v chunks per stage (`virtual_pipeline_model_parallel_size`, which
Megatron's arguments derive from `num_layers_per_virtual_pipeline_stage` too), the model is cut into
pp x v chunks of equal size, dealt round-robin: chunk c of stage p holds the (c x pp + p)-th
(megatron-core's `get_transformer_layer_offset`). Layouts migrator does not compute (an explicit
`pipeline_model_parallel_layout`, embedding or loss counted as a layer, uneven stages under a virtual
pipeline) are refused by name rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .rankfile import RankFile

REFUSED = (
    ("pipeline_model_parallel_layout", "an explicit pipeline layout"),
    ("account_for_embedding_in_pipeline_split", "the embedding counted as a pipeline layer"),
    ("account_for_loss_in_pipeline_split", "the loss counted as a pipeline layer"),
    ("standalone_embedding_stage", "a stage holding only the embedding"),
)
"""args that change which layers a stage holds in ways migrator does not compute (and why)."""


@dataclass(frozen=True)
class Unit:
    """The layers one (stage, chunk) holds: its first global layer and how many."""

    stage: int
    chunk: int
    first: int
    count: int


def virtual_chunks(args: dict[str, Any], pp: int, f: RankFile) -> int:
    """The number of model chunks per stage (1 without a virtual pipeline)."""
    v = args.get("virtual_pipeline_model_parallel_size")
    if v is None:
        per = args.get("num_layers_per_virtual_pipeline_stage")
        total = args.get("num_layers")
        if per is None:
            return 1
        if type(per) is not int or per < 1 or type(total) is not int or total % (pp * per):
            raise f.bad(f"args.num_layers_per_virtual_pipeline_stage {per!r} does not divide num_layers {total!r} "
                        f"over {pp} pipeline stages")
        return total // (pp * per)
    if type(v) is not int or v < 1:
        raise f.bad(f"args.virtual_pipeline_model_parallel_size is {v!r}, not a positive integer")
    return v


def units(args: dict[str, Any], pp: int, v: int, f: RankFile) -> list[Unit]:
    """Every (stage, chunk) with its layers, in the order of the layers."""
    for key, what in REFUSED:
        value = args.get(key)
        if value is not None and value is not False:
            raise f.bad(f"args.{key} is set: {what}, which migrator does not join (stages' layers unknown)")
    total = args.get("num_layers")
    if type(total) is not int or total < 0:
        raise f.bad("args.num_layers is not a non-negative integer")
    ends = {0: args.get("decoder_first_pipeline_num_layers"), pp - 1: args.get("decoder_last_pipeline_num_layers")}
    fixed = {p: n for p, n in ends.items() if n is not None} if pp > 1 else {}
    for n in fixed.values():
        if type(n) is not int or n < 0:
            raise f.bad("args.decoder_first/last_pipeline_num_layers is not a non-negative integer")
    if v > 1:
        if fixed:
            raise f.bad("uneven first or last pipeline stages under a virtual pipeline: migrator does not join them")
        if total % (pp * v):
            raise f.bad(f"num_layers {total} cannot be divided into {pp} stages x {v} virtual chunks")
        per = total // (pp * v)
        return [Unit(p, c, (c * pp + p) * per, per) for c in range(v) for p in range(pp)]
    rest_stages = pp - len(fixed)
    rest = total - sum(fixed.values())
    if rest < 0 or (rest_stages == 0 and rest) or (rest_stages and rest % rest_stages):
        raise f.bad(f"num_layers {total} cannot be divided over {pp} pipeline stages"
                    + (f" with {fixed} layers on the first/last" if fixed else ""))
    each = rest // rest_stages if rest_stages else 0
    out, first = [], 0
    for p in range(pp):
        count = fixed.get(p, each)
        out.append(Unit(p, 0, first, count))
        first += count
    return out

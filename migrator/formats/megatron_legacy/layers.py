"""How many transformer layers each pipeline stage holds, from the checkpoint's `args`.

A stage numbers its layers from 0 in its own file; its first layer is the sum of the layers of the
stages before it. Megatron divides `num_layers` evenly over `pipeline_model_parallel_size` stages,
unless `decoder_first_pipeline_num_layers` / `decoder_last_pipeline_num_layers` give the first or last
stage its own count (the rest then divided evenly). Layouts migrator does not compute (a virtual
pipeline, an explicit `pipeline_model_parallel_layout`, embedding or loss counted as a layer) are
refused by name rather than guessed.
"""

from __future__ import annotations

from typing import Any

from .rankfile import RankFile

REFUSED = (
    ("virtual_pipeline_model_parallel_size", "a virtual pipeline (interleaved stages)"),
    ("num_layers_per_virtual_pipeline_stage", "a virtual pipeline (interleaved stages)"),
    ("num_virtual_stages_per_pipeline_rank", "a virtual pipeline (interleaved stages)"),
    ("pipeline_model_parallel_layout", "an explicit pipeline layout"),
    ("account_for_embedding_in_pipeline_split", "the embedding counted as a pipeline layer"),
    ("account_for_loss_in_pipeline_split", "the loss counted as a pipeline layer"),
    ("standalone_embedding_stage", "a stage holding only the embedding"),
)
"""args that change which layers a stage holds in ways migrator does not compute (and why)."""


def stage_layers(args: dict[str, Any], pp: int, f: RankFile) -> list[int]:
    """The number of layers of each of the `pp` stages."""
    for key, what in REFUSED:
        if _set(key, args.get(key)):
            raise f.bad(f"args.{key} is set: {what}, which migrator does not join (stages' layers unknown)")
    total = args.get("num_layers")
    if type(total) is not int or total < 0:
        raise f.bad("args.num_layers is not a non-negative integer")
    ends = {0: args.get("decoder_first_pipeline_num_layers"), pp - 1: args.get("decoder_last_pipeline_num_layers")}
    fixed = {p: n for p, n in ends.items() if n is not None}
    for n in fixed.values():
        if type(n) is not int or n < 0:
            raise f.bad("args.decoder_first/last_pipeline_num_layers is not a non-negative integer")
    if pp == 1:
        return [total]
    rest_stages = pp - len(fixed)
    rest = total - sum(fixed.values())
    if rest < 0 or (rest_stages == 0 and rest) or (rest_stages and rest % rest_stages):
        raise f.bad(f"num_layers {total} cannot be divided over {pp} pipeline stages"
                    + (f" with {fixed} layers on the first/last" if fixed else ""))
    each = rest // rest_stages if rest_stages else 0
    return [fixed.get(p, each) for p in range(pp)]


def _set(key: str, value: Any) -> bool:
    """Whether an arg of `REFUSED` asks for its layout (a virtual pipeline of size 1 is none)."""
    if value is None or value is False:
        return False
    return not (key == "virtual_pipeline_model_parallel_size" and type(value) is int and value == 1)

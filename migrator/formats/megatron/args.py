"""Megatron-LM's saved values, read as plain data by both Megatron readers.

Megatron-LM saves `{'args': the run's arguments (a pickled arguments object), 'checkpoint_version': 3.0,
'iteration': N, ...}`: in `common.pt` of a `torch_dist` checkpoint (`formats.torch_dist.common`), in
every rank file of a legacy one (`formats.megatron_legacy.rankfile`). The pickle went through the
restricted interpreter; here the arguments become a dict of plain data (`formats.pytorch.namespace`),
and `megatron_config` the counts as Megatron itself derives them where the saved value is unused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..pytorch.namespace import described, namespace_fields, plain


@dataclass(frozen=True)
class Saved:
    """The values Megatron-LM saves beside the weights: `args` ({} when none were saved)."""

    args: dict[str, Any] = field(default_factory=dict)
    checkpoint_version: Any = None
    iteration: Any = None


def saved_values(root: Mapping[Any, Any], bad: Callable[[str], Exception]) -> Saved:
    """`root`'s `args`, `checkpoint_version` and `iteration` as plain data; `bad(message)` is the error
    raised for an `args` that is not Megatron-LM's arguments object (the caller names the file)."""
    raw = root.get("args")
    fields = namespace_fields(raw)
    if fields is None and raw is not None:
        raise bad(f"'args' is {described(raw)}, not the pickled arguments object Megatron-LM saves")
    args = plain(fields) if fields is not None else {}
    return Saved(args, plain(root.get("checkpoint_version")), plain(root.get("iteration")))


def query_groups(args: Mapping[str, Any]) -> Any:
    """The key/value groups Megatron builds: the saved `num_query_groups` under `group_query_attention`,
    else one group per attention head (the saved value is then unused)."""
    return args.get("num_query_groups") if args.get("group_query_attention") else args.get("num_attention_heads")


def head_size(args: Mapping[str, Any]) -> Any:
    """`kv_channels`, else `hidden_size / num_attention_heads` as Megatron derives it (None when unknown)."""
    if args.get("kv_channels") is not None:
        return args["kv_channels"]
    hidden, heads = args.get("hidden_size"), args.get("num_attention_heads")
    if type(hidden) is int and type(heads) is int and heads > 0:
        return hidden // heads
    return None


def megatron_config(args: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments as a recipe's `${config.KEY}` reads them: `num_query_groups` and `kv_channels` the
    values Megatron uses (`query_groups`, `head_size`); `norm_epsilon` the `layernorm_epsilon` that
    Megatron-LM saves since its arguments became TransformerConfig's fields (2026) when it has no other."""
    config = dict(args)
    if config.get("norm_epsilon") is None and config.get("layernorm_epsilon") is not None:
        config["norm_epsilon"] = config["layernorm_epsilon"]
    if args.get("num_attention_heads") is not None:
        config["num_query_groups"] = query_groups(args)
    config["kv_channels"] = head_size(args)
    return config

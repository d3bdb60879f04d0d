"""The global shapes the checkpoint's `args` imply, checked after the ranks are joined.

A rank count or a split rule that disagreed with the files would make tensors of the wrong size; the
args say what some must be (`padded_vocab_size` rows of the embedding and output layer, the QKV rows
of `num_attention_heads` queries and `num_query_groups` key/value groups, `ffn_hidden_size` rows of
the MLP's first projection, doubled by SwiGLU), so a contradiction is refused naming the tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ...core.errors import FormatError
from ...core.tensor import LazyTensor
from ..megatron.args import head_size, query_groups


def _int(args: dict[str, Any], key: str) -> int | None:
    value = args.get(key)
    return value if type(value) is int and value > 0 else None


def _vocab(args: dict[str, Any]) -> int | None:
    return _int(args, "padded_vocab_size")


def _qkv(args: dict[str, Any]) -> int | None:
    heads, groups, channels = _int(args, "num_attention_heads"), query_groups(args), head_size(args)
    if heads is None or not _positive(groups) or not _positive(channels):
        return None
    return (heads + 2 * groups) * channels


def _positive(value: Any) -> bool:
    return type(value) is int and value > 0


def _fc1(args: dict[str, Any]) -> int | None:
    ffn = _int(args, "ffn_hidden_size")
    return None if ffn is None else ffn * (2 if args.get("swiglu") else 1)


CHECKS: tuple[tuple[re.Pattern[str], Callable[[dict[str, Any]], int | None], str], ...] = (
    (re.compile(r"^(embedding\.word_embeddings|output_layer)\.weight$"), _vocab, "padded_vocab_size"),
    (re.compile(r"^decoder\.layers\.\d+\.self_attention\.linear_qkv\.(weight|bias)$"), _qkv,
     "(num_attention_heads + 2 x num_query_groups) x kv_channels"),
    (re.compile(r"^decoder\.layers\.\d+\.mlp\.linear_fc1\.(weight|bias)$"), _fc1,
     "ffn_hidden_size (x 2 with swiglu)"),
)
"""(global name, the rows the args make it, how): dim 0 of each matching tensor."""


def check_shapes(tensors: Sequence[LazyTensor], args: dict[str, Any], label: str) -> None:
    for t in tensors:
        for pattern, rows, how in CHECKS:
            if not pattern.match(t.name):
                continue
            want = rows(args)
            if want is not None and t.shape and t.shape[0] != want:
                raise FormatError(f"joined, it has {t.shape[0]} rows, but the args say {want} ({how})",
                                  file=label, tensor=t.name)

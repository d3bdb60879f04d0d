"""Transformer-shaped checkpoints for benchmarks, generated tensor by tensor (never the whole model)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from migrator import dtypes
from migrator.tensor import LazyTensor


def gpt2_shapes(layers: int = 24, d: int = 1024, vocab: int = 50257, ctx: int = 1024) -> Iterator[tuple[str, tuple]]:
    """GPT-2 medium by default: ~355M parameters, ~1.42 GB in fp32 (HF names, Conv1D layout)."""
    yield "wte.weight", (vocab, d)
    yield "wpe.weight", (ctx, d)
    for i in range(layers):
        p = f"h.{i}."
        yield p + "ln_1.weight", (d,)
        yield p + "ln_1.bias", (d,)
        yield p + "attn.c_attn.weight", (3 * d, d)
        yield p + "attn.c_attn.bias", (3 * d,)
        yield p + "attn.c_proj.weight", (d, d)
        yield p + "attn.c_proj.bias", (d,)
        yield p + "ln_2.weight", (d,)
        yield p + "ln_2.bias", (d,)
        yield p + "mlp.c_fc.weight", (4 * d, d)
        yield p + "mlp.c_fc.bias", (4 * d,)
        yield p + "mlp.c_proj.weight", (d, 4 * d)
        yield p + "mlp.c_proj.bias", (d,)
    yield "ln_f.weight", (d,)
    yield "ln_f.bias", (d,)


def lazy_random(shapes: Iterator[tuple[str, tuple]], seed: int = 0) -> list[LazyTensor]:
    """Lazy fp32 tensors whose bytes are generated only when written."""
    out = []
    for i, (name, shape) in enumerate(shapes):
        def load(shape: tuple = shape, i: int = i) -> memoryview:
            arr = np.random.default_rng(seed + i).standard_normal(shape, dtype=np.float32)
            return memoryview(arr.reshape(-1).view(np.uint8))

        n = int(np.prod(shape)) * 4
        out.append(LazyTensor(name, dtypes.F32, tuple(shape), n, load))
    return out

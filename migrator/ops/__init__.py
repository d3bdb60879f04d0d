"""The recipe's ops, one module each, registered when imported (`base.Op`; the registry is `OPS`).

Layout ops move bytes (offset adds a constant as it moves them); computed ops make new values
(`Op.computes`); docs/ops.md lists every one, written from the registry. What they share: `base.py`
(the registry, the options' base and checks, what `build` is given), `streams.py` (reading a tensor
front to back, a streamed output), `computing.py` (the computed ops' inputs) and `compute/` (their
arithmetic). The graph engine that matches, groups and applies them is `transform/ops.py`.

A new op is one module defining `class MyOp(Op, name="my_op")`, imported below (or by whoever uses
it; `Recipe` is rebuilt for an op registered after it was built): the schema, the checks,
docs/ops.md and the plan pick it up from the registry.
"""

# imported to register, in the order the schema, the docs and the hints list them; an op module imports
# another op's module only inside a function, so that it does not register that one first
from . import (  # noqa: F401, I001
    split,
    concat,
    stack,
    unstack,
    reshape,
    permute,
    slice,
    rope_permute,
    offset,
    linear,
    scale,
    slerp,
    task_arithmetic,
    lora_fold,
    gather,
    add_rows,
    repeat,
    clone,
    new,
)
from .base import OPS, Op

__all__ = ["OPS", "Op"]

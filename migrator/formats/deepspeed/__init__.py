"""DeepSpeed ZeRO-1/2/3 checkpoint folders, read as one source and consolidated streamed.

`folder` finds the step (`latest`, or a tag) and each rank's files by name; `states` reads a state
file with the PyTorch reader (its pickle through the restricted interpreter, nothing run) and
keeps its values; `partitions` is the layout arithmetic (which elements of which rank's flat
partition make each parameter) and the reads; `optimizer` the optimizer state per parameter (made of
the same pieces) and the whole checkpoint it makes; `reader` is the `ZeroReader` that lists the fp32
master weights (or, with `top_level_key="module"`, the module's own weights; with `keep_structure`, the
whole training checkpoint). docs/training-checkpoints.md describes the layout and the commands.
"""

from __future__ import annotations

from .folder import is_zero_checkpoint
from .reader import ZeroReader

__all__ = ["ZeroReader", "is_zero_checkpoint"]

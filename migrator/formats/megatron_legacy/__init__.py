"""Legacy Megatron-LM checkpoints (`--ckpt-format torch`): `iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt`.

`folder` finds the iteration (the tracker file, or the folder given) and each rank's file by name;
`rankfile` reads one with the PyTorch reader (its pickle through the restricted interpreter, the
pickled `args` read as data); `splits` is the table of how each tensor is divided between tensor-parallel
ranks and the older names it renames; `layers` how many layers each pipeline stage holds; `rows` a
rank's SwiGLU half; `shapes` the sizes the args imply; `reader` the `MegatronLegacyReader` joining
them into one lazy global state dict. docs/training-checkpoints.md describes the layout and commands.
"""

from __future__ import annotations

from .folder import is_megatron_legacy
from .reader import MegatronLegacyReader

__all__ = ["MegatronLegacyReader", "is_megatron_legacy"]

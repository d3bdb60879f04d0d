"""Megatron-core `torch_dist` checkpoints (what Megatron-LM and NeMo save through megatron-core's
`dist_checkpointing`): a DCP folder (`.metadata` + `__R_K.distcp`) plus `metadata.json` (the backend)
and `common.pt` (what is not sharded: the training `args`, the iteration).

`layout` says whether a path is one (names and a small JSON file, no reader imported), `common` reads
`common.pt`'s arguments as plain data, `layers` cuts the stacked layer (and expert) axis into
per-layer tensors, `reader` puts them together over the DCP reader, `hf_config` makes a Hugging
Face config.json from the arguments.
"""

from __future__ import annotations

from .layout import torch_dist_folder

__all__ = ["torch_dist_folder"]  # the reader: `formats.torch_dist.reader.TorchDistReader`

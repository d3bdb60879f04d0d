"""Megatron-core `torch_dist` checkpoints: a DCP folder with megatron-core's `metadata.json` and
`common.pt`, the layers stacked on a leading axis, written for `dist_checkpointing.load`
(`formats/dcp/megatron.py`)."""

from __future__ import annotations

from ..spec import FormatSpec

SPEC = FormatSpec(
    name="torch_dist", title="Megatron-core torch_dist",
    summary="Megatron-core `torch_dist` (Megatron-LM, NeMo 2's `weights/`)",
    recognized_by="a folder with `.metadata` and megatron-core's `metadata.json` or `common.pt`",
    writer="migrator.formats.dcp.megatron:TorchDistWriter", folder=True, torch_names=True)

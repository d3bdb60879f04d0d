"""Megatron-core `torch_dist` checkpoints (Megatron-LM, NeMo 2's `weights/`): a DCP folder with
`metadata.json` and `common.pt`, read by `formats/torch_dist/` and written for megatron-core's
`dist_checkpointing.load` by `formats/dcp/megatron.py`."""

from __future__ import annotations

from ..spec import FormatSpec

SPEC = FormatSpec(
    name="torch_dist", title="Megatron Core torch_dist",
    summary="Megatron-core `torch_dist` (Megatron-LM, NeMo 2's `weights/`)",
    recognized_by="a folder with `.metadata` and megatron-core's `metadata.json` or `common.pt`", folder=True,
    torch_names=True, writer="migrator.formats.dcp.megatron:TorchDistWriter", source_config=True, keeps_structure=True,
    optimizer_by_name=True)

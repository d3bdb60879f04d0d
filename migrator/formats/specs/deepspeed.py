"""DeepSpeed ZeRO checkpoint folders (`formats/deepspeed/`). Read only."""

from __future__ import annotations

from ..spec import FormatSpec

SPEC = FormatSpec(
    name="deepspeed", title="DeepSpeed ZeRO", summary="DeepSpeed ZeRO-1/2/3 checkpoint",
    recognized_by="`latest` or `global_step<N>/` with rank state files", folder=True,
    keeps_structure=True, param_ids_by_name=False)

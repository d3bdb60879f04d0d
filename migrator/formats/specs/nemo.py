"""NeMo 2 checkpoint folders (`weights/` + `context/`, `formats/nemo/`), read through the torch_dist
reader with the model configuration of `context/model.yaml`. Read only."""

from __future__ import annotations

from ..spec import FormatSpec

SPEC = FormatSpec(
    name="nemo", title="NeMo 2 checkpoint",
    summary="NeMo 2 checkpoint folder (`weights/`: torch_dist, `context/`: model.yaml, io.json)",
    recognized_by="a folder whose `context/` holds `model.yaml` or `io.json`", folder=True,
    torch_names=True)

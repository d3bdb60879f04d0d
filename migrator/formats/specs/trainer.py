"""Hugging Face Trainer checkpoint folders read with their training state (`files/trainer.py`). Read only;
written back as a Trainer folder by a recipe whose target is one (`plan/trainer_target.py`)."""

from __future__ import annotations

from ..spec import FormatSpec

SPEC = FormatSpec(
    name="trainer", title="Hugging Face Trainer checkpoint",
    summary="Hugging Face Trainer checkpoint (`checkpoint-N/`, with its training state)",
    recognized_by="`trainer_state.json` and `optimizer.pt` beside a model", folder=True, keeps_structure=True,
    trainer_folder=True)

"""Whether a path is a NeMo 2 checkpoint folder, from the file system alone.

NeMo 2 saves a checkpoint as a folder holding `weights/` (the torch_dist checkpoint) and `context/`
(`io.json`, `model.yaml`, the tokenizer's files, `artifacts/`): `nemo.lightning.ckpt_utils` names both.
"""

from __future__ import annotations

import os
from pathlib import Path

WEIGHTS = "weights"
CONTEXT = "context"
MODEL_YAML = "model.yaml"
IO_JSON = "io.json"


def nemo_folder(path: str | os.PathLike[str]) -> Path | None:
    """`path` when it is a NeMo 2 checkpoint folder (its `context/` holds `model.yaml` or `io.json`);
    None otherwise. A folder with such a `context/` and no `weights/` is one (the reader refuses it,
    naming what is missing). Its `weights/` alone is a torch_dist checkpoint (`nemo_weights`)."""
    p = Path(path)
    return p if _has_context(p) else None


def nemo_weights(folder: str | os.PathLike[str]) -> Path | None:
    """The NeMo 2 checkpoint folder whose `weights/` is `folder`, or None."""
    p = Path(folder)
    return p.parent if p.name == WEIGHTS and _has_context(p.parent) else None


def _has_context(folder: Path) -> bool:
    context = folder / CONTEXT
    return context.is_dir() and ((context / MODEL_YAML).is_file() or (context / IO_JSON).is_file())

"""Whether a path is a Megatron-core `torch_dist` checkpoint, from the file system alone.

megatron-core's `dist_checkpointing.save` writes `metadata.json` (`{"sharded_backend": "torch_dist",
...}`) and `common.pt` beside DCP's `.metadata`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

METADATA_FILE = ".metadata"
BACKEND_FILE = "metadata.json"
COMMON_FILE = "common.pt"
MAX_BACKEND_BYTES = 1 << 16
"""metadata.json is about 120 bytes: a bigger one is not megatron-core's."""


def torch_dist_folder(path: str | os.PathLike[str]) -> Path | None:
    """The checkpoint folder `path` names (the folder or its `.metadata`), when megatron-core wrote it;
    None otherwise (a plain DCP folder included)."""
    p = Path(path)
    folder = p.parent if p.name == METADATA_FILE and p.is_file() else p
    if not (folder / METADATA_FILE).is_file():
        return None
    if (folder / BACKEND_FILE).is_file() and backend(folder) is not None:
        return folder
    # beside common.pt, a metadata.json that names no backend is megatron-core's, broken: the reader says so
    return folder if (folder / COMMON_FILE).is_file() else None


def backend(folder: Path) -> str | None:
    """`metadata.json`'s `sharded_backend` (`torch_dist`, or another that migrator names when refusing);
    None when the file is not megatron-core's."""
    try:
        with open(folder / BACKEND_FILE, "rb") as f:
            raw = f.read(MAX_BACKEND_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_BACKEND_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    found = data.get("sharded_backend") if isinstance(data, dict) else None
    return found if isinstance(found, str) else None


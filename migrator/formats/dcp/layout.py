"""Whether a path is a DCP checkpoint: from the file system alone, so that asking (every source a
command opens is asked, `files.io.open_file`) imports no reader."""

from __future__ import annotations

import os
from pathlib import Path

METADATA_FILE = ".metadata"


def dcp_folder(path: str | os.PathLike[str]) -> Path | None:
    """The checkpoint folder `path` names: a folder holding `.metadata`, or the `.metadata` file itself."""
    p = Path(path)
    if p.name == METADATA_FILE and p.is_file():
        return p.parent
    if p.is_dir() and (p / METADATA_FILE).is_file():
        return p
    return None

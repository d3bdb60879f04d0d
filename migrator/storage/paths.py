"""Where a path from a recipe or a command line points (shared by the plan and the plain convert)."""

from __future__ import annotations

import os
from pathlib import Path


def resolve_path(base_dir: Path, path: str | os.PathLike[str]) -> Path:
    """User folder expanded, relative to `base_dir` (a recipe's folder, or the current one), normalised.
    A URL (`s3://...`) is taken as it is (a `RemotePath`)."""
    from .remote import RemotePath, is_url, local_of, url_of

    if is_url(path):
        return RemotePath(url_of(path))
    p = Path(os.path.expanduser(os.fspath(local_of(path))))
    return Path(os.path.normpath(p if p.is_absolute() else base_dir / p))

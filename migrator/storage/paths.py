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


def where(path: str | os.PathLike[str], *, real: bool = False) -> str:
    """A path typed on a command line (`--source`, `--target`, a job's paths, `diff`'s A), as text any
    process can use: a URL as spelled (its scheme normalised), a local path made absolute from the
    current folder (never from a recipe's), `~` expanded, a `file:` URL read as its path; `real`: with
    links resolved, to compare what jobs read and write."""
    from .remote import is_url, local_of, url_of

    if is_url(path):
        return url_of(path)
    local = os.path.expanduser(os.fspath(local_of(path)))
    return os.path.realpath(local) if real else os.path.abspath(local)


def given_path(path: str | os.PathLike[str]) -> Path:
    """`where(path)` as a Path (a `RemotePath` for a URL): the one rule for a command line's paths."""
    from .remote import as_path, is_url

    return as_path(path) if is_url(path) else Path(where(path))

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


def hf_blobs(folder: str) -> str | None:
    """The `blobs` folder of the Hugging Face cache repository whose snapshot `folder` (resolved) is
    (`.../models--org--name/snapshots/REV`), or None when it is not a snapshot."""
    snapshots = os.path.dirname(folder)
    if os.path.basename(snapshots) != "snapshots":
        return None
    blobs = os.path.join(os.path.dirname(snapshots), "blobs")
    return os.path.realpath(blobs) if os.path.isdir(blobs) else None


def resolves_inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether `path`, links resolved, is inside `folder` (resolved). The one exception: in a Hugging
    Face cache snapshot, whose files are links to `../../blobs/HASH`, a file directly in that
    repository's `blobs/` is inside (a snapshot's subfolder, `snapshots/REV/sub/x`, counts as the
    snapshot's: its links climb one more level to the same `blobs/`)."""
    real, top = os.path.realpath(path), os.path.realpath(folder)
    if os.path.commonpath([top, real]) == top:
        return True
    for _ in range(MAX_SNAPSHOT_DEPTH):
        blobs = hf_blobs(top)
        if blobs is not None:
            return os.path.dirname(real) == blobs
        up = os.path.dirname(top)
        if up == top:
            break
        top = up
    return False


MAX_SNAPSHOT_DEPTH = 3
"""How far above a source's folder a Hugging Face cache snapshot is looked for (`snapshots/REV/a/b`)."""


def require_inside(path: str | os.PathLike[str], folder: str | os.PathLike[str], given: str,
                   what: str = "file") -> None:
    """THE rule for every file a source of several files reads, however it was found (listed in its
    folder, matched by a glob, named by an index, a `.metadata`, a `latest` file): resolved, it lies
    inside the folder the source names (`resolves_inside`, the Hugging Face cache's own links
    allowed); else a FormatError naming it and where it leads, with `given` (the source) as the file."""
    if not resolves_inside(path, folder):
        from ..core.errors import FormatError

        raise FormatError(f"{what} {path} leads out of {folder} (it resolves to {os.path.realpath(path)}); "
                          "the files of a checkpoint must lie inside its folder", file=given)

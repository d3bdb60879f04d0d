"""Object-store URLs (`s3://`, `gs://`, `az://`, `hf://`, `http(s)://`, `memory://`) wherever a path goes.

This module is what the rest of migrator imports to ask "is this a URL?": it imports nothing beyond
the standard library, so a run on local paths never loads fsspec. Ranged reads, uploads and the
fsspec side are in the submodules (`source`, `upload`, `fs`; storage options in `options`), each
importing fsspec and the protocol's package on first use; opening and saving folders of shards on
a store is `files.remote_open` and `files.remote_sharded`.

A recipe's paths are `pathlib.Path`s, which fold `s3://b/k` into `s3:/b/k`; `RemotePath` is a Path
that prints (and `os.fspath`s) as the URL again, so the plan, the report and the commands carry it
like any other path. `path.parent`, `path.name`, `path / "x"` keep working on it.
"""

from __future__ import annotations

import os
import re
from pathlib import PosixPath
from typing import Any

from ...core.redact import redact  # the rule for every URL shown or stored: here for the store's errors

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")
"""`scheme:/` (a Path keeps one slash of two); two letters at least, so `C:/` is never a URL."""

READ_ONLY = frozenset({"http", "https"})


def is_url(path: object) -> bool:
    """Whether `path` (str, PathLike) names an object by URL rather than a local file."""
    if isinstance(path, RemotePath):
        return True
    if isinstance(path, bytes | bytearray | memoryview):
        return False
    try:
        text = os.fspath(path)  # type: ignore[call-overload]
    except TypeError:
        return False
    if not isinstance(text, str):
        return False
    m = _SCHEME.match(text)
    return m is not None and m.group(1).lower() != "file"


_FILE_URL = re.compile(r"^file:/+", re.IGNORECASE)


def local_of(path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """A `file:` URL as the local path it names (`file:///data/m.bpk` -> `/data/m.bpk`, percent-escapes
    decoded); anything else unchanged. A Path folds `file:///x` into `file:/x`: both are read as `/x`,
    so a target never becomes a folder literally named `file:`."""
    text = os.fspath(path)
    if not isinstance(text, str):
        return path
    m = _FILE_URL.match(text)
    if m is None:
        return path
    from urllib.parse import unquote

    return "/" + unquote(text[m.end():])


def url_of(path: str | os.PathLike[str]) -> str:
    """The URL `path` spells, with the `//` after the scheme restored."""
    text = os.fspath(path)
    m = _SCHEME.match(text)
    if m is None:
        raise ValueError(f"not a URL: {redact(text)}")
    rest = text[m.end():].lstrip("/")
    return f"{m.group(1).lower()}://{rest}"


def protocol(url: str) -> str:
    return url.split(":", 1)[0].lower()


class RemotePath(PosixPath):
    """A URL carried as a Path: `str()` and `os.fspath()` give the URL (`s3://bucket/key`)."""

    def __str__(self) -> str:
        parts = self.parts
        if not parts:
            return ""
        return parts[0] + "//" + "/".join(parts[1:])

    def __fspath__(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"RemotePath({redact(str(self))!r})"

    def as_posix(self) -> str:
        return str(self)

    # a URL is never a local file, folder or link: the local checks that ask must say no
    def exists(self, *a: Any, **k: Any) -> bool:
        return False

    def is_file(self) -> bool:
        return False

    def is_dir(self) -> bool:
        return False

    def is_symlink(self) -> bool:
        return False


def as_path(path: str | os.PathLike[str]) -> PosixPath:
    """`Path(path)`, or a `RemotePath` when it is a URL (a Path would lose the URL's `//`)."""
    from pathlib import Path

    return RemotePath(url_of(path)) if is_url(path) else Path(local_of(path))  # type: ignore[return-value]



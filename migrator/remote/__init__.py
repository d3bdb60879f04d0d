"""Object-store URLs (`s3://`, `gs://`, `az://`, `hf://`, `http(s)://`, `memory://`) wherever a path goes.

This module is what the rest of migrator imports to ask "is this a URL?": it imports nothing beyond
the standard library, so a run on local paths never loads fsspec. The readers, the uploader and the
sharded folders over URLs are in the submodules (`fs`, `source`, `upload`, `sharded`), each
importing fsspec and the protocol's package on first use.

A recipe's paths are `pathlib.Path`s, which fold `s3://b/k` into `s3:/b/k`; `RemotePath` is a Path
that prints (and `os.fspath`s) as the URL again, so the plan, the report and the commands carry it
like any other path. `path.parent`, `path.name`, `path / "x"` keep working on it.
"""

from __future__ import annotations

import os
import re
from pathlib import PosixPath
from typing import Any

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")
"""`scheme:/` (a Path keeps one slash of two); two letters at least, so `C:/` is never a URL."""
_URL_END = "\\s'\"<>`"
"""Characters that end a URL inside other text: whitespace, quotes (a JSON string, a quoted path), angle brackets."""
_USERINFO = re.compile(rf"(?<=://)[^/?#{_URL_END}]*@")
"""The user info of a URL: everything of its authority up to the *last* '@' (a password may hold '@')."""
_QUERY = re.compile(rf"(://[^?#{_URL_END}]*)\?[^#{_URL_END}]*")
"""A URL's whole query, ':' and '@' included: presigned and SAS signatures, credentials, dates."""

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


def redact(text: str) -> str:
    """`text` with the user-info of every URL in it (`user:password@`) replaced by `***@`, and its
    query (a presigned URL's signature, a SAS token) by `?***`.

    The one rule for every URL migrator shows or stores: error messages, terminal text
    (`display.escape`), JSON on stdout, reports and HTML pages (`display.json_text`) all pass through
    it. A URL ends at whitespace, a quote or an angle bracket, so in JSON text it never reaches into
    the next string."""
    if "://" not in text:  # the common case: no URL at all
        return text
    return _QUERY.sub(r"\1?***", _USERINFO.sub("***@", text))


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


_OPTIONS: dict[str, dict[str, Any]] = {}


def register_options(url: str | os.PathLike[str], options: dict[str, Any] | None) -> None:
    """Storage options (a recipe's `storage_options:`) for `url` and everything below it.

    Checked for secrets first (`fs.check_storage_options`). Kept per process: the recipe's paths are
    opened and written by code far from the recipe (sharded folders, templates).
    """
    if not options or not is_url(url):
        return
    from .fs import check_storage_options

    check_storage_options(options)
    _OPTIONS[url_of(url).rstrip("/")] = dict(options)


def options_for(url: str) -> dict[str, Any]:
    """The options registered for the longest prefix of `url` (none: the protocol's defaults)."""
    best = ""
    for prefix in _OPTIONS:
        if (url == prefix or url.startswith(prefix.rstrip("/") + "/")) and len(prefix) > len(best):
            best = prefix
    return dict(_OPTIONS[best]) if best else {}


# Target checks for local paths and URLs alike: the local ones live in migrator.atomic(_folder).

def check_folder_target(target: Any, *, overwrite: bool, protect: Any = (), outputs: Any = ()) -> None:
    """`atomic_folder.check_folder_target`, or the object store's own check for a URL."""
    if is_url(target):
        from .sharded import check_remote_folder
        from .upload import check_remote_target

        url = url_of(target)
        check_remote_target(url + "/", overwrite=True)  # http(s) is read-only
        check_remote_folder(url, overwrite=overwrite)
        return
    from ..atomic_folder import check_folder_target as local

    local(target, overwrite=overwrite, protect=protect, outputs=outputs)


def check_target(target: Any, *, overwrite: bool, protect: Any = (), outputs: Any = ()) -> None:
    """`atomic.check_target`, or the object store's own check for a URL."""
    if is_url(target):
        from .upload import check_remote_target

        check_remote_target(url_of(target), overwrite=overwrite, protect=protect)
        return
    from ..atomic import check_target as local

    local(target, overwrite=overwrite, protect=protect, outputs=outputs)


def target_problems(target: Any, *, overwrite: bool, protect: Any = ()) -> list[str]:
    """`atomic.target_problems`, or the object store's own for a URL."""
    if is_url(target):
        from .upload import target_problems as remote

        return remote(url_of(target), overwrite=overwrite, protect=protect)
    from ..atomic import target_problems as local

    return local(target, overwrite=overwrite, protect=protect)

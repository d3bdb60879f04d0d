"""How a planned output is written and published, as one value: `WriteOptions`.

`files.io.save_planned`, `files.io.save` and the parallel writes (`run/parallel_write.py`) take one
`WriteOptions` instead of a row of keywords; `save` and `save_planned` also take the keywords
(`WriteKeywords`, the public API's form: callers' code keeps working), laid over the value given.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, TypedDict

from ..storage.atomic import Protected

if TYPE_CHECKING:
    from ..storage.remote.options import StorageOptions

Progress = Callable[[BinaryIO, int], AbstractContextManager[None]]
"""`progress(sink, total_bytes)`, entered around the streaming (e.g. a progress bar)."""


@dataclass(frozen=True)
class WriteOptions:
    """`overwrite`: replace an existing target; `protect`: files the write must not replace (the
    sources read); `outputs`: the run's other outputs (a `--report`); `progress`: see `Progress`;
    `fsync`: flush to disk before publishing; `mode_from`: the files (or modes) whose permission
    bits a new file takes; `make_folders`: create the target's missing parent folders; `storage`: the
    options a URL is written with. `protect`, `outputs` and `mode_from` are kept as tuples."""

    overwrite: bool = False
    protect: Sequence[Protected] = ()
    outputs: Sequence[str | os.PathLike[str]] = ()
    progress: Progress | None = None
    fsync: bool = True
    mode_from: Sequence[str | os.PathLike[str] | int] = ()
    make_folders: bool = False
    storage: StorageOptions | None = None

    def __post_init__(self) -> None:
        for name in ("protect", "outputs", "mode_from"):  # a generator given is read once, here
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def with_keywords(self, keywords: Mapping[str, Any]) -> WriteOptions:
        """These options with the keywords given (`WriteKeywords`) in place of their fields."""
        return dataclasses.replace(self, **keywords) if keywords else self


DEFAULT_WRITE = WriteOptions()


class WriteKeywords(TypedDict, total=False):
    """`WriteOptions`'s fields as keywords (`save_planned(writer, path, overwrite=True)`)."""

    overwrite: bool
    protect: Iterable[Protected]
    outputs: Iterable[str | os.PathLike[str]]
    progress: Progress | None
    fsync: bool
    mode_from: Iterable[str | os.PathLike[str] | int]
    make_folders: bool
    storage: StorageOptions | None


class SaveKeywords(TypedDict, total=False):
    """The write keywords `save` has always taken."""

    overwrite: bool
    protect: Iterable[str | os.PathLike[str]]
    progress: Progress | None
    fsync: bool

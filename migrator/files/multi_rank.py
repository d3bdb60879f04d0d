"""A checkpoint written by many ranks (a DCP folder, local or on a store; a set of rank files) opened
as one reader, with `top_level_key` applied: shared by `files.io` and `files.remote_open`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..formats.base import Reader

if TYPE_CHECKING:
    from ..storage.read_context import ReadContext


def open_dcp(folder: str | os.PathLike[str], options: dict[str, Any], read: ReadContext) -> Reader:
    """A DCP checkpoint folder (local, or a URL prefix) as one reader within `read`, `top_level_key` applied."""
    from ..formats.dcp.reader import DcpReader

    keep = bool(options.pop("keep_structure", False)) and options.get("top_level_key") in (None, "", [])
    return selected(DcpReader(folder, read=read, keep_structure=keep), options)


def selected(reader: Reader, options: dict[str, Any]) -> Reader:
    """`top_level_key` (a name prefix) of a reader over several files, which takes no other option."""
    key = options.pop("top_level_key", None)
    options.pop("keep_structure", None)
    try:
        if options:
            raise TypeError(f"options {sorted(options)} do not apply to this source")
        if key not in (None, "", []):
            reader.select(key)
    except BaseException:
        reader.close()
        raise
    return reader

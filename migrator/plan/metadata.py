"""What goes into an output's metadata: Burn-like defaults, the source's entries, provenance."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..core.version import PRODUCER, __version__
from ..formats.registry import find, is_format

if TYPE_CHECKING:
    from ..storage.remote.options import StorageOptions

RECIPE_HASH_KEY = "migrator.recipe_sha256"
VERSION_KEY = "migrator.version"
SOURCE_HASH_KEY = "migrator.source_sha256"
TEMPLATE_HASH_KEY = "migrator.template_sha256"


def default_metadata(fmt: str) -> dict[str, str]:
    """What Burn's stores write on every save (`format`, `producer`, `version`), migrator as producer.

    For SafeTensors `format` is `pt`, not Burn's `safetensors`: that is the value transformers 4.x
    requires, and Burn ignores the key.
    """
    found = find(fmt)
    if found is None or found.metadata != "text" or found.metadata_format is None:
        return {}
    return {"format": found.metadata_format, "producer": PRODUCER, "version": __version__}


def loadable_metadata(meta: dict[str, str], fmt: str, *, clear: bool = False) -> dict[str, str]:
    """Give non-empty SafeTensors metadata without a `format` key `format: pt`, in place.

    transformers 4.x refuses such a file (no metadata at all is fine, so empty stays empty).
    `clear` (`--no-metadata`) means the user chose the entries: nothing is added then.
    """
    found = find(fmt)
    if found is not None and found.format_key_required and found.metadata_format and meta and not clear:
        meta.setdefault("format", found.metadata_format)
    return meta


def output_metadata(source_format: str, target_format: str, source_meta: Mapping[str, str], *,
                    extra: Mapping[str, str] | None = None, clear: bool = False) -> dict[str, str]:
    """Same format: the source's metadata untouched (a rewrite stays byte-identical).

    Across formats: the source's entries, then the target's defaults on top, so `format` always
    names the file it is written in (`pt` for SafeTensors). `clear` drops everything; `extra` is
    added last, so an explicit `format` wins.
    """
    if is_format(target_format, metadata="typed"):  # typed key/values (GGUF's): only a GGUF source's carry over
        carried = dict(source_meta) if source_format == target_format and not clear else {}
        return {**carried, **(extra or {})}
    if clear:
        meta: dict[str, str] = {}
    elif source_format == target_format:
        meta = dict(source_meta)
    else:
        meta = {**_carried(source_format, source_meta), **default_metadata(target_format)}
    meta.update(extra or {})
    return loadable_metadata(meta, target_format, clear=clear) if is_format(target_format, metadata="text") else {}


def _carried(source_format: str, source_meta: Mapping[str, str]) -> dict[str, str]:
    """The source entries another format takes: a GGUF source's arrays (vocabularies, merges) are left
    out, since their text is only a summary; its other key/values become plain text."""
    if not is_format(source_format, metadata="typed"):
        return dict(source_meta)
    return {k: str(v) for k, v in source_meta.items() if getattr(v, "item_type", None) is None}


def sha256_file(path: str | os.PathLike[str], storage: StorageOptions | None = None) -> str:
    """sha256 of a local file, or of an object on a store (read once more, front to back, with its
    options from `storage`)."""
    import hashlib  # only for --hash-sources: every other run skips its ~3 ms import

    from ..storage.remote.fs import stream_blocks

    h = hashlib.sha256()
    for block in stream_blocks(path, "source", storage=storage):
        h.update(block)
    return h.hexdigest()

"""What goes into an output's metadata: Burn-like defaults, the source's entries, provenance."""

from __future__ import annotations

import os
from collections.abc import Mapping

from . import PRODUCER, __version__

METADATA_FORMATS = ("burnpack", "safetensors")
RECIPE_HASH_KEY = "migrator.recipe_sha256"
VERSION_KEY = "migrator.version"
SOURCE_HASH_KEY = "migrator.source_sha256"
TEMPLATE_HASH_KEY = "migrator.template_sha256"


def default_metadata(fmt: str) -> dict[str, str]:
    """What Burn's stores write on every save (`format`, `producer`, `version`), migrator as producer."""
    if fmt not in METADATA_FORMATS:
        return {}
    return {"format": fmt, "producer": PRODUCER, "version": __version__}


def output_metadata(source_format: str, target_format: str, source_meta: Mapping[str, str], *,
                    extra: Mapping[str, str] | None = None, clear: bool = False) -> dict[str, str]:
    """Same format: the source's metadata untouched (a rewrite stays byte-identical).

    Across formats: the source's entries, then the target's defaults on top, so `format` always
    names the file it is written in. `clear` drops everything; `extra` is added last.
    """
    if clear:
        meta: dict[str, str] = {}
    elif source_format == target_format:
        meta = dict(source_meta)
    else:
        meta = {**source_meta, **default_metadata(target_format)}
    meta.update(extra or {})
    return meta if target_format in METADATA_FORMATS else {}


def sha256_file(path: str | os.PathLike[str], chunk: int = 8 << 20) -> str:
    import hashlib  # only for --hash-sources: every other run skips its ~3 ms import

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()

"""A folder's weights as a recipe or a command line name them: the shard and index file names,
and shard sizes (`5GB`). Standard library only (and the format registry): the recipe's validators check these without
loading the writers (`sharded_writer.py` writes the folder).
"""

from __future__ import annotations

import os
import re

from ..formats.registry import spec

DEFAULT_MAX_SIZE = "5GB"  # huggingface_hub's and save_pretrained's default
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)


def check_weights_name(name: str) -> None:
    """A weights file name for a folder: one plain file name (no folder part, no hidden or empty name)."""
    if not name or name in (".", "..") or name.startswith(".") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"'{name}' is not a file name: give a plain name such as model.safetensors")


def weights_patterns(fmt: str, name: str | None) -> tuple[str, str]:
    """(shard name pattern with `{suffix}`, index name) of a folder's weights: Hugging Face's defaults
    for the format, or those of `name` (`llama.safetensors` -> `llama{suffix}.safetensors`,
    `llama.safetensors.index.json`)."""
    if name is None:
        return spec(fmt).shard_names or ("", "")
    check_weights_name(name)
    stem, ext = os.path.splitext(name)
    return stem.replace("{", "{{").replace("}", "}}") + "{suffix}" + ext, name + ".index.json"


def parse_size(size: int | str) -> int:
    """Bytes from `5GB` (5*10^9), `5GiB` (5*2^30) or a bare integer, as Hugging Face reads sizes."""
    if isinstance(size, bool):
        raise ValueError(f"expected a size, got {str(size).lower()}")
    if isinstance(size, int):
        value = size
    else:
        m = _SIZE.match(size)
        if m is None or (m[2] and m[2][-1] == "b"):
            raise ValueError(f"cannot read size '{size}': write an integer (bytes) or one with a unit, "
                             "e.g. 5GB (5*10^9 bytes) or 5GiB (5*2^30 bytes)")
        value = int(m[1]) * _UNITS[(m[2] or "").upper()]
    if value <= 0:
        raise ValueError(f"a shard size must be positive, got {size}")
    return value

"""The source's config.json as a target's writer is given it (`FormatSpec.source_config`): a Megatron
`torch_dist` target derives its `common.pt` arguments from it (`formats.megatron.from_hf`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..core.errors import PlanError
from ..formats.registry import is_format


def source_config(out_fmt: str, path: Path | None) -> dict[str, Any]:
    """The writer option `source_config` for a format that takes one (None: the source has no config.json
    beside it, nor a recipe's `config:` naming one); {} for the others."""
    if not is_format(out_fmt, source_config=True):
        return {}
    if path is None:
        return {"source_config": None}
    from ..files.model_config import ConfigError, load_config
    from ..formats.megatron.from_hf import SourceConfig

    try:
        data = load_config(path)
    except ConfigError as e:
        raise PlanError(str(e), file=os.fspath(path)) from None
    return {"source_config": SourceConfig(data, os.path.normpath(path))}

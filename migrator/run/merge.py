"""A fold plan or a merge spec written to a Hugging Face folder.

`fold_folder` / `merge_folder` do the whole job: tensors in SafeTensors shards plus index, and the
companion files (`config.json`, generation and tokenizer files) of the base, with `num_hidden_layers`
updated by a merge's slices.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.dtypes import DType
from ..core.tensor import LazyTensor
from ..transform.merging.peft_adapter import FoldPlan, fold_plan, open_adapter
from ..transform.merging.tensors import fold_tensors, merge_tensors, open_models

if TYPE_CHECKING:
    from ..recipe.mergekit import LoadedConfig, MergeSpec

COMPANIONS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt",
              "added_tokens.json", "chat_template.jinja")
"""Files a Hugging Face model folder carries beside its weights, copied when present."""

DEFAULT_SHARD = "5GB"


def _save_folder(tensors: list[LazyTensor], out: str | os.PathLike[str], companions_from: Path | None, *,
                 overwrite: bool, max_shard_size: int | str, config_update: Mapping[str, Any] | None = None) -> None:
    from ..files.io import save_planned
    from ..files.sharded_writer import ShardedWriter

    copies: list[tuple[str, bool]] = []
    if companions_from is not None and companions_from.is_dir():
        copies = [(name, True) for name in COMPANIONS if not (config_update and name == "config.json")]
    writer = ShardedWriter("safetensors", tensors, metadata={"format": "pt"}, max_size=max_shard_size,
                           copies=copies, copy_from=companions_from)
    save_planned(writer, out, overwrite=overwrite)
    if config_update is not None and companions_from is not None and (companions_from / "config.json").is_file():
        config = json.loads((companions_from / "config.json").read_text(encoding="utf-8"))
        config.update(config_update)
        _write_text(Path(out) / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def fold_folder(base: str | os.PathLike[str], adapter: str | os.PathLike[str], out: str | os.PathLike[str], *,
                lora_scale: float | None = None, out_dtype: DType | None = None, overwrite: bool = False,
                max_shard_size: int | str = DEFAULT_SHARD) -> FoldPlan:
    """`base` (a file or Hugging Face folder) with the PEFT adapter folded in, written to the folder `out`
    (with the base folder's config, generation and tokenizer files)."""
    from ..files.io import open_file

    with open_file(base) as reader, open_adapter(adapter) as peft:
        plan = fold_plan(reader, peft, lora_scale=lora_scale)
        tensors = fold_tensors(reader, plan, out_dtype=out_dtype)
        # companion files come from a model folder only (a loose file's folder may hold anything)
        companions = Path(base) if Path(base).is_dir() else None
        _save_folder(tensors, out, companions, overwrite=overwrite, max_shard_size=max_shard_size)
    return plan


def merge_folder(config: str | os.PathLike[str] | LoadedConfig, out: str | os.PathLike[str], *,
                 seed: int | None = None, overwrite: bool = False,
                 max_shard_size: int | str = DEFAULT_SHARD) -> MergeSpec:
    """Run a mergekit config: the merged tensors in shards, the base's companion files with its config.json
    updated (`num_hidden_layers` after slices, `dtype`), and the config itself as `mergekit_config.yml`."""
    from ..recipe.mergekit import LoadedConfig, load_config, merge_spec, model_paths

    loaded = config if isinstance(config, LoadedConfig) else load_config(config)
    with ExitStack() as stack:
        models = open_models(*model_paths(loaded), stack)
        spec = merge_spec(loaded, {ref: list(t.keys()) for ref, t in models.items()}, seed=seed)
        tensors = merge_tensors(spec, models)
        companions = Path(spec.models[spec.companions_from]) if spec.companions_from else None
        _save_folder(tensors, out, companions, overwrite=overwrite, max_shard_size=max_shard_size,
                     config_update=spec.config_update)
    _write_text(Path(out) / "mergekit_config.yml", loaded.text)
    return spec


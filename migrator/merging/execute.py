"""A small driver from a fold plan or a merge spec to written output (until the recipe plan runs these).

`fold_tensors` / `merge_tensors` turn a plan into the output's lazy tensors, which any of migrator's
writers saves (`formats.save`, sharded with `max_shard_size`); `fold_folder` / `merge_folder` do the
whole job for Hugging Face folders: tensors in SafeTensors shards plus index, and the companion files
(`config.json`, generation and tokenizer files) of the base, with `num_hidden_layers` updated by a
merge's slices.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..dtypes import DType
from ..tensor import LazyTensor
from .lora import fold
from .peft_adapter import Folded, FoldPlan, Replaced, fold_plan, open_adapter
from .problems import MergeInputError

if TYPE_CHECKING:
    from .mergekit_config import LoadedConfig, MergeSpec

COMPANIONS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt",
              "added_tokens.json", "chat_template.jinja")
"""Files a Hugging Face model folder carries beside its weights, copied when present."""

DEFAULT_SHARD = "5GB"


def fold_tensors(base: Mapping[str, LazyTensor], plan: FoldPlan, *, out_dtype: DType | None = None) -> list[LazyTensor]:
    """The output tensors of a fold plan, in the base's order, each in `out_dtype` (default: the base's)."""
    from ..casts import cast

    out: list[LazyTensor] = []
    for name, entry in plan.entries.items():
        dtype = out_dtype if out_dtype is not None else base[name].dtype
        if isinstance(entry, Folded):
            weight = entry.weight if entry.weight is not None else base[name]
            out.append(fold(name, weight, entry.fold, out_dtype=dtype))
        elif isinstance(entry, Replaced):
            out.append(cast(entry.tensor.renamed(name), dtype))
        else:
            t = base[name]
            out.append(cast(t, dtype) if out_dtype is not None else t)
    return out


def _save_folder(tensors: list[LazyTensor], out: str | os.PathLike[str], companions_from: Path | None, *,
                 overwrite: bool, max_shard_size: int | str, config_update: Mapping[str, Any] | None = None) -> None:
    from ..formats import save_planned
    from ..formats.sharded_writer import ShardedWriter

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
    from ..formats import open_file

    with open_file(base) as reader, open_adapter(adapter) as peft:
        plan = fold_plan(reader, peft, lora_scale=lora_scale)
        tensors = fold_tensors(reader, plan, out_dtype=out_dtype)
        # companion files come from a model folder only (a loose file's folder may hold anything)
        companions = Path(base) if Path(base).is_dir() else None
        _save_folder(tensors, out, companions, overwrite=overwrite, max_shard_size=max_shard_size)
    return plan


def merge_tensors(spec: MergeSpec, models: Mapping[str, Mapping[str, LazyTensor]]) -> list[LazyTensor]:
    """The output tensors of a merge spec, given each model's tensors by the spec's model ids."""
    from . import arithmetic

    out: list[LazyTensor] = []
    for item in spec.tensors:
        inputs = []
        for model, name in item.inputs:
            tensors = models[model]
            if name not in tensors:
                raise MergeInputError(f"model '{model}' has no tensor '{name}' (needed for '{item.name}')",
                                      tensor=name)
            inputs.append(tensors[name])
        p = item.params
        dtype = spec.out_dtype or spec.dtype
        if item.op == "passthrough":
            out.append(arithmetic.passthrough(item.name, inputs[0], factor=p.get("scale"), out_dtype=dtype))
        elif item.op == "linear":
            out.append(arithmetic.linear(item.name, inputs, p["weights"], normalize=p["normalize"], out_dtype=dtype))
        elif item.op == "slerp":
            out.append(arithmetic.slerp(item.name, inputs[0], inputs[1], p["t"], out_dtype=dtype))
        else:
            out.append(arithmetic.task_arithmetic(
                item.name, inputs[0], inputs[1:], p["weights"], densities=p["densities"], sparsify=p["sparsify"],
                consensus=p["consensus"], normalize=p["normalize"], lambda_=p["lambda"], rescale=p["rescale"],
                seed=p.get("seed"), out_dtype=dtype))
    return out


def open_models(paths: Mapping[str, str], loras: Mapping[str, str],
                stack: ExitStack) -> dict[str, Mapping[str, LazyTensor]]:
    """Each model opened (once per folder), a `base+lora` one with its adapter folded in (lazily)."""
    from ..formats import open_file

    readers: dict[str, Mapping[str, LazyTensor]] = {}
    models: dict[str, Mapping[str, LazyTensor]] = {}
    for ref, path in paths.items():
        if path not in readers:
            readers[path] = stack.enter_context(open_file(path))
        tensors = readers[path]
        lora = loras.get(ref)
        if lora is not None:
            adapter = stack.enter_context(open_adapter(lora))
            folded = fold_tensors(tensors, fold_plan(tensors, adapter))
            tensors = {t.name: t for t in folded}
        models[ref] = tensors
    return models


def merge_folder(config: str | os.PathLike[str] | LoadedConfig, out: str | os.PathLike[str], *,
                 seed: int | None = None, overwrite: bool = False,
                 max_shard_size: int | str = DEFAULT_SHARD) -> MergeSpec:
    """Run a mergekit config: the merged tensors in shards, the base's companion files with its config.json
    updated (`num_hidden_layers` after slices, `dtype`), and the config itself as `mergekit_config.yml`."""
    from .mergekit_config import LoadedConfig, load_config, merge_spec, model_paths

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


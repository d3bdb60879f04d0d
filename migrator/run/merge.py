"""`migrate merge`: a mergekit config run as a one-off recipe, and the LoRA fold of `convert --lora`.

`merge_recipe` is the recipe a merge runs: the config as a `format: mergekit` source (its merged
tensors, `transform/merging/merged.py`), a Hugging Face folder as the target (SafeTensors shards
plus index, the reference model's config, generation and tokenizer files, each when present, its
config.json updated with the merge's `num_hidden_layers` and dtype, the config itself as
`mergekit_config.yml`, and with `tokenizer_source: PATH` that folder's tokenizer files instead of
the reference's), and an optional dtype cast. `merge` plans and runs it as `convert` runs its
recipe: atomic folder publish, the same result and notes. `fold_folder` is `convert BASE OUT/ --lora`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.dtypes import DType
from ..core.limits import DEFAULT_LIMITS, Limits
from .convert import ConvertResult, convert

if TYPE_CHECKING:
    from ..recipe.model import Recipe

DEFAULT_SHARD = "5GB"
CONFIGS = ("config.json", "generation_config.json")
"""The reference model's config files a merged folder carries, each when present."""


def merge_recipe(config: str | os.PathLike[str], out: str | os.PathLike[str], *, seed: int | None = None,
                 dtype: str | None = None, max_shard_size: int | str = DEFAULT_SHARD, overwrite: bool = False,
                 fsync: bool = True) -> Recipe:
    """The recipe of `migrate merge CONFIG OUT/` (validated like any recipe)."""
    from ..recipe.mergekit import load_config
    from ..recipe.model import Recipe
    from ..transform.merging.tokenizer_source import TOKENIZER_FILES

    # the tokenizer files come from the reference model, or (tokenizer_source: PATH) are the merge's own
    own_tokenizer = load_config(config).config.tokenizer_source not in (None, "base")
    companions = CONFIGS if own_tokenizer else (*CONFIGS, *TOKENIZER_FILES)
    source: dict[str, Any] = {"path": os.fspath(config), "format": "mergekit"}
    if seed is not None:
        source["seed"] = seed
    data: dict[str, Any] = {
        "version": 1, "source": source,
        "target": {"path": os.fspath(out), "shard": {"max_size": max_shard_size}, "overwrite": overwrite,
                   "fsync": fsync, "copy": [{"path": c, "optional": True} for c in companions]}}
    if dtype is not None:
        data["dtype"] = {"cast": dtype}
    return Recipe.model_validate(data)


def merge(config: str | os.PathLike[str], out: str | os.PathLike[str], *, seed: int | None = None,
          dtype: str | None = None, max_shard_size: int | str = DEFAULT_SHARD, overwrite: bool = False,
          fsync: bool = True, progress: bool | None = None, recipe_sha256: str | None = None,
          limits: Limits = DEFAULT_LIMITS) -> ConvertResult:
    """Run a mergekit config into the Hugging Face folder `out`, atomically (see the module docstring)."""
    from ..files.targets import check_folder_target
    from ..plan.build import build_plan
    from ..storage.paths import resolve_path
    from .convert import _result
    from .execute import run_plan

    recipe = merge_recipe(config, out, seed=seed, dtype=dtype, max_shard_size=max_shard_size, overwrite=overwrite,
                          fsync=fsync)
    check_folder_target(resolve_path(Path.cwd(), out), overwrite=overwrite)  # before any model is opened
    with build_plan(recipe, Path.cwd(), recipe_sha256=recipe_sha256, limits=limits) as plan:
        written = run_plan(plan, progress=progress)
        return _result(plan, written.target)


def merge_folder(config: str | os.PathLike[str], out: str | os.PathLike[str], *, seed: int | None = None,
                 overwrite: bool = False, max_shard_size: int | str = DEFAULT_SHARD) -> ConvertResult:
    """`merge` without progress: the library form the tests and benchmarks call."""
    return merge(config, out, seed=seed, overwrite=overwrite, max_shard_size=max_shard_size, progress=False)


def fold_folder(base: str | os.PathLike[str], adapter: str | os.PathLike[str], out: str | os.PathLike[str], *,
                lora_scale: float | None = None, out_dtype: DType | None = None, overwrite: bool = False,
                max_shard_size: int | str = DEFAULT_SHARD) -> ConvertResult:
    """`migrate convert BASE OUT/ --lora ADAPTER`: the base with the adapter folded in, written to the
    folder `out` with the base folder's config, generation and tokenizer files."""
    return convert(base, os.fspath(out).rstrip("/" + os.sep) + "/", progress=False, lora=adapter,
                   lora_scale=lora_scale, dtype=None if out_dtype is None else out_dtype.display,
                   overwrite=overwrite, max_shard_size=max_shard_size)

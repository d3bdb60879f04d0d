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
    from ..transform.merging.vocabulary import TOKENIZER_FILES

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
    from ..plan.build import RecipeFile, build_plan
    from ..storage.paths import resolve_path
    from .convert import _result
    from .execute import run_plan

    recipe = merge_recipe(config, out, seed=seed, dtype=dtype, max_shard_size=max_shard_size, overwrite=overwrite,
                          fsync=fsync)
    check_folder_target(resolve_path(Path.cwd(), out), overwrite=overwrite)  # before any model is opened
    with build_plan(recipe, Path.cwd(), file=RecipeFile(recipe_sha256), limits=limits) as plan:
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


TASK_OPS = {(None, None): "task_arithmetic", ("magnitude", "sum"): "ties", ("random", "sum"): "dare_ties",
            ("random", None): "dare_linear"}
"""The recipe op of a task-arithmetic tensor, by its (sparsify, consensus)."""


def plain_recipe(config: str | os.PathLike[str], out: str | os.PathLike[str], *, seed: int | None = None,
                 dtype: str | None = None, max_shard_size: int | str = DEFAULT_SHARD, overwrite: bool = False,
                 fsync: bool = True, relative_to: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The merge as a plain recipe: each model a `sources:` entry with a prefix (`lora:` for `base+lora`), one
    computed op per group of tensors that share their parameters, the reference model's companions copied.
    Running it writes the merge's tensors and companion files (not `mergekit_config.yml`: the recipe is the
    record). None when a config has no such form: passthrough, `slices:` that change the layer count
    (config.json's `num_hidden_layers`) or take a tensor from another layer, a tokenizer source
    (`tokenizer_source`, `tokenizer:`).
    Paths are made relative to `relative_to` (a folder) when given.
    The models' headers are read; no tensor data."""
    import re

    from ..transform.merging.merged import MergedReader
    from ..transform.merging.vocabulary import TOKENIZER_FILES

    def path(p: str) -> str:
        if relative_to is None:
            return p
        rel = os.path.relpath(os.path.abspath(p), os.path.abspath(relative_to))
        return rel + "/" if p.endswith(("/", os.sep)) and not rel.endswith("/") else rel

    reader = MergedReader(config, seed=seed)
    with reader:
        spec, loaded = reader.spec, reader.loaded
        if spec.method == "passthrough" or spec.tokenizer is not None:
            return None
        reference = spec.companions_from or ""
        if loaded.config.slices is not None and not _same_layer_count(spec, reference):
            return None
        if any(item.inputs[0][0] != reference for item in spec.tensors):
            return None  # the output takes the order of the first input's source: it must be the reference
        refs = list(dict.fromkeys(m for item in spec.tensors for m, _ in item.inputs))
        prefix = {ref: f"m{i}." for i, ref in enumerate(refs)}
        used = {ref: {n for item in spec.tensors for m, n in item.inputs if m == ref} for ref in refs}
        sources: list[dict[str, Any]] = []
        for ref in refs:
            entry: dict[str, Any] = {"name": ref, "path": path(spec.models[ref]), "prefix": prefix[ref]}
            if ref in spec.loras:
                entry["lora"] = path(spec.loras[ref])
            extra = [t.name for t in _model_tensors(reader, ref) if t.name not in used[ref]]
            if extra:  # a model's tensors the reference lacks are not in the merge
                entry["filter"] = {"exclude": [{"path": n} for n in extra]}
            sources.append(entry)
        groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
        for item in spec.tensors:
            if any(n != item.name for _, n in item.inputs):
                return None
            op = _op_of(item, spec)
            key = repr((op, [m for m, _ in item.inputs]))
            groups.setdefault(key, (op, []))[1].append(item.name)
        names = [item.name for item in spec.tensors]
        ops = []
        for op, members in groups.values():
            body = next(iter(op.values()))
            models = body.pop("_models")
            alternatives = ".*" if len(members) == len(names) else "|".join(re.escape(n) for n in members)
            body["from"] = [f"{re.escape(prefix[models[0]])}({alternatives})", *(f"{prefix[m]}$1" for m in models[1:])]
            body["to"] = "$1"
            out_dtype = spec.out_dtype or spec.dtype
            if out_dtype is not None:
                body["dtype"] = out_dtype.name
            ops.append({next(iter(op)): {k: body[k] for k in ("from", "to", *[k for k in body if k not in
                                                                                ("from", "to")])}})
        companions = CONFIGS + TOKENIZER_FILES
        data: dict[str, Any] = {
            "version": 1, "sources": sources, "ops": ops,
            "target": {"path": path(os.fspath(out)), "shard": {"max_size": max_shard_size}, "overwrite": overwrite,
                       "fsync": fsync, "copy_from": path(spec.models[reference]),
                       "copy": [{"path": c, "optional": True} for c in companions]}}
        if dtype is not None:
            data["dtype"] = {"cast": dtype}
    from ..recipe.model import Recipe

    Recipe.model_validate(data)  # what migrate run will read
    return data


def _same_layer_count(spec: Any, reference: str) -> bool:
    """Whether the merge leaves the reference's config.json `num_hidden_layers` as it is."""
    import json

    want = (spec.config_update or {}).get("num_hidden_layers")
    try:
        with open(os.path.join(spec.models[reference], "config.json"), "rb") as f:
            have = json.loads(f.read(1 << 20)).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError):
        return False
    return want is None or want == have


def _model_tensors(reader: Any, ref: str) -> list[Any]:
    part = next((p for p in reader.parts if p.label == reader.spec.models[ref]), None)
    return list(part.reader.tensors) if part is not None else []


def _op_of(item: Any, spec: Any) -> dict[str, Any]:
    """{op name: its keys} for one tensor of the spec, `_models` listing the input models in order."""
    p = item.params
    models = [m for m, _ in item.inputs]
    if item.op == "linear":
        return {"linear": {"weights": p["weights"], "normalize": p["normalize"], "_models": models}}
    if item.op == "slerp":
        return {"slerp": {"t": p["t"], "_models": models}}
    body: dict[str, Any] = {"weights": p["weights"], "lambda": p["lambda"], "normalize": p["normalize"],
                            "rescale": p["rescale"], "_models": models}
    if p["sparsify"] is not None:
        body["density"] = p["densities"]
    if p.get("seed") is not None:
        body["seed"] = p["seed"]
    return {TASK_OPS[(p["sparsify"], p["consensus"])]: body}


def emitted_recipe(config: str | os.PathLike[str], out: str | os.PathLike[str], recipe_output: str | None,
                   **options: Any) -> str:
    """The text `migrate merge --emit-recipe` writes: the plain recipe (`plain_recipe`) when the config has one,
    else the `format: mergekit` recipe, each with its paths relative to `recipe_output`'s folder when given."""
    import yaml

    from ..recipe.convert import emit_recipe, schema_line

    folder = os.path.dirname(os.path.abspath(recipe_output)) if recipe_output else None
    data = plain_recipe(config, out, relative_to=folder, **options)
    if data is None:
        return emit_recipe(merge_recipe(config, out, **options), recipe_output)
    return schema_line() + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)

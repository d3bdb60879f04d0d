"""A recipe file's plan as the commands build it: the file loaded, the command line's `--source` /
`--target` in place of its paths, and planned within the command line's settings (`--limit`,
`--overwrite`, `--no-fsync`, `--hash-sources`), a wrong `top_level_key` named at its recipe line.

`migrate run | plan | validate`, each job of many and each Ray write task re-planning its job come here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.limits import DEFAULT_LIMITS
from .build import Plan, build_plan
from .sources import SourceKeyError

if TYPE_CHECKING:
    from ..recipe.loader import LoadedRecipe
    from ..recipe.model import Recipe


def load(path: str, args: Any = None) -> Any:
    """The recipe, with the command line's `--source` / `--target` (if any) in place of its paths."""
    from ..recipe.loader import load_recipe

    loaded = load_recipe(path)
    overrides = overrides_of(args)
    return with_paths(loaded, overrides) if overrides else loaded


def overrides_of(args: Any) -> dict[str, str]:
    """{"source": PATH, "target": PATH} as given on the command line (either may be absent)."""
    return {k: v for k in ("source", "target") if (v := getattr(args, k, None))}


def with_paths(loaded: Any, overrides: dict[str, str]) -> Any:
    """`loaded` reading/writing the given paths instead of its own.

    Command-line paths are taken from the current folder (as every shell path is), not from the
    recipe's: they are made absolute here, so the recipe's folder no longer applies to them. The
    loader's "target is the source" check is repeated for the new pair: the run would destroy its input.
    """
    import dataclasses
    import os

    from ..recipe.loader import RecipeError, RecipeIssue, read_candidates, same_file, written_candidates

    recipe = loaded.recipe
    if "source" in overrides and recipe.sources is not None:
        from .sources import override_source

        recipe = override_source(recipe, overrides.pop("source"), str(loaded.path))
    from ..storage.remote import as_path, is_url, local_of

    absolute = {k: as_path(v) if is_url(v) else Path(os.path.abspath(os.path.expanduser(local_of(v))))
                for k, v in overrides.items()}
    if "source" in absolute:
        assert recipe.source is not None
        recipe = recipe.model_copy(update={"source": recipe.source.model_copy(update={"path": absolute["source"]})})
    if "target" in absolute:
        recipe = recipe.model_copy(update={"target": _target_in(recipe, overrides["target"], absolute["target"])})
    out = dataclasses.replace(loaded, recipe=recipe)
    reads = out.source_paths + ([out.template_path] if out.template_path is not None else [])
    written = written_candidates(out.target_path, recipe.target.format)
    if any(same_file(w, c) for w in written for r in reads for c in read_candidates(r)):
        raise RecipeError([RecipeIssue(str(loaded.path), 0, 0, "--target",
                                       f"the target {out.target_path} is the same file as the source or template",
                                       "write the output to a new file")])
    return out


def _target_in(recipe: Any, given: str, path: Any) -> Any:
    """The recipe's target written to `given`. A folder (`DIR/`, or an existing folder) keeps the
    recipe's format: a Hugging Face folder for SafeTensors/PyTorch (the recipe's shards, else 5GB
    ones: one model.safetensors when it fits), for burnpack `DIR/<the recipe's file name>`. A
    target never changes format because of how --target is spelled."""
    from ..formats.detect import from_extension
    from ..storage.remote import is_url

    target = recipe.target
    folder = given.endswith(("/", os.sep)) or (not is_url(given) and os.path.isdir(given))
    if not folder:
        return target.model_copy(update={"path": path})
    fmt = target.format if target.format != "auto" else from_extension(target.path) or (
        "safetensors" if target.shard is not None else "burnpack")
    if fmt == "burnpack":
        name = os.path.basename(str(target.path).rstrip("/")) or "model.bpk"
        return target.model_copy(update={"path": os.path.join(str(path), name)})
    from ..recipe.model import ShardSpec

    shard = target.shard or ShardSpec.model_validate({})
    return target.model_copy(update={"path": path, "format": fmt, "shard": shard})


def plan_of(loaded: LoadedRecipe, *, recipe: Recipe | None = None, **options: Any) -> Plan:
    """`build_plan` of a loaded recipe file, given all the loader knows of it: its hash, and where its
    modules, ops and sources are written (an error names its recipe line, whichever command planned
    it). `recipe`: the file's recipe with a path replaced (`diff`'s A); `options`: `build_plan`'s."""
    plan = build_plan(loaded.recipe if recipe is None else recipe, loaded.base_dir, recipe_sha256=loaded.sha256,
                      module_origins=loaded.module_origins, op_origins=loaded.op_origins,
                      source_origins=loaded.source_origins, **options)
    plan.read_also = other_inputs(loaded)  # no output of the run may replace the recipe or its config
    return plan


@contextmanager
def open_plan(loaded: Any, args: Any, shown: str | None = None) -> Iterator[Plan]:
    """The recipe's plan, open for the block, read within the command line's `--limit` settings."""
    try:
        plan = plan_of(loaded, hash_sources=getattr(args, "hash_sources", False),
                       overwrite=True if getattr(args, "overwrite", False) else None,
                       fsync=False if getattr(args, "no_fsync", False) else None,
                       limits=getattr(args, "reader_limits", DEFAULT_LIMITS))
    except SourceKeyError as e:  # about one recipe value: name its line
        from ..recipe.loader import locate

        given = shown or getattr(args, "recipe", None)  # the recipe's path as given
        where = locate(loaded, e.loc, given if isinstance(given, str) else None)
        if where is None:
            raise
        located = SourceKeyError(f"{where}: {loc_text(e.loc)}: {e}")
        located.file = e.file  # the source file, for --json; the text leads with the recipe line
        raise located from None
    with plan:
        yield plan


def other_inputs(loaded: Any) -> list[Path]:
    """What a run reads beside its sources and template: the recipe file, and the model config its
    `${config.KEY}` values come from (named by `config:`, else found beside the first source)."""
    from ..recipe.config import find_config

    found: list[Path] = [Path(os.path.abspath(loaded.path))]
    with suppress(OSError, ValueError):  # a config that cannot be looked for protects nothing
        config = find_config(loaded.recipe.config, loaded.recipe.inputs()[0].path, loaded.base_dir)
        if config is not None:
            found.append(Path(os.path.abspath(config)))
    return found


def loc_text(loc: tuple[str | int, ...]) -> str:
    """('sources', 1, 'top_level_key') as the recipe spells it: sources[1].top_level_key."""
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(loc))

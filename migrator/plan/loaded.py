"""A recipe file's plan as the commands build it: the file loaded, the command line's `--source` /
`--target` in place of its paths, and planned within the command line's settings (`--limit`,
`--overwrite`, `--no-fsync`, `--hash-sources`), a wrong `top_level_key` named at its recipe line.

`migrate run | plan | validate`, each job of many and each Ray write task re-planning its job come here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.limits import DEFAULT_LIMITS, Limits
from .build import Plan, RecipeFile, build_plan
from .sources import SourceKeyError

if TYPE_CHECKING:
    from ..recipe.loader import LoadedRecipe
    from ..recipe.model import Recipe


def load(path: str | os.PathLike[str], overrides: Mapping[str, str] | None = None, *, compared: bool = False,
         shown: str | None = None) -> LoadedRecipe:
    """The recipe, with the command line's `--source` / `--target` (if any) in place of its paths.
    `compared`: the plan is compared, never written (`diff --recipe`: `source` is A); `shown`: the
    recipe's path as given, for the errors about an override."""
    from ..recipe.loader import load_recipe

    loaded = load_recipe(path)
    return with_paths(loaded, overrides, compared=compared, shown=shown) if overrides else loaded


def with_paths(loaded: LoadedRecipe, overrides: Mapping[str, str], *, compared: bool = False,
               shown: str | None = None) -> LoadedRecipe:
    """`loaded` reading/writing the given paths instead of its own: the one place a command line's
    paths replace a recipe's (`migrate run | plan | validate`, each job, `diff --recipe`).

    Command-line paths are taken from the current folder (as every shell path is), not from the
    recipe's (`storage.paths.given_path`), so the recipe's folder no longer applies to them. A
    `sources:` recipe's `--source` is NAME=PATH (`_source_entry`). The loader's "target is the
    source" check is repeated for the new pair: the run would destroy its input (a compared plan
    writes nothing: not checked).
    """
    import dataclasses

    from ..recipe.loader import RecipeError, RecipeIssue, read_candidates, written_candidates
    from ..storage.atomic import same_file
    from ..storage.paths import given_path

    loaded = _configured_for(loaded, overrides)
    recipe = loaded.recipe
    rest = dict(overrides)
    rest.pop("config", None)
    state = rest.pop("training_state", None)  # not a path: the recipe's own key
    if "source" in rest and recipe.sources is not None:
        recipe = _source_entry(loaded, rest.pop("source"), compared, shown or str(loaded.path))
    absolute = {k: given_path(v) for k, v in rest.items()}
    if "source" in absolute:
        assert recipe.source is not None
        recipe = recipe.model_copy(update={"source": recipe.source.model_copy(update={"path": absolute["source"]})})
    if "target" in absolute:
        recipe = recipe.model_copy(update={"target": _target_in(recipe, rest["target"], absolute["target"])})
    if state is not None:
        recipe = recipe.model_copy(update={"training_state": state})
    out = dataclasses.replace(loaded, recipe=recipe)
    if compared:
        return out
    reads = out.source_paths + ([out.template_path] if out.template_path is not None else [])
    written = written_candidates(out.target_path, recipe.target.format)
    if any(same_file(w, c) for w in written for r in reads for c in read_candidates(r)):
        raise RecipeError([RecipeIssue(str(loaded.path), 0, 0, "--target",
                                       f"the target {out.target_path} is the same file as the source or template",
                                       "write the output to a new file")])
    return out


def _configured_for(loaded: LoadedRecipe, overrides: Mapping[str, str]) -> LoadedRecipe:
    """`loaded` with its `${config...}` values taken from the config beside the first source the
    overrides name (`--source PATH`, or `NAME=PATH` for the first `sources:` entry), since that is
    the checkpoint the run reads; unchanged when the first source is the recipe's own. `--config FILE`
    names the config instead (from the current folder), in place of the recipe's `config:`."""
    from ..recipe.loader import reload_for_source
    from ..storage.paths import given_path

    config = overrides.get("config")
    value = overrides.get("source")
    recipe = loaded.recipe
    if value is not None and recipe.sources is not None:
        name, sep, path = value.partition("=")
        first = sep and path and recipe.sources and name == recipe.sources[0].label
        value = path if first else None
    if value is None and config is None:
        return loaded
    source = given_path(value) if value is not None else loaded.source_path
    return reload_for_source(loaded, source, config=None if config is None else given_path(config))


def _source_entry(loaded: LoadedRecipe, value: str, compared: bool, shown: str) -> Recipe:
    """`--source NAME=PATH` for a `sources:` recipe: entry NAME reads PATH instead. A bare PATH is
    refused (which entry it replaces would be a guess), except by `diff`, whose A may be one of the
    recipe's own sources (the plan is then the recipe's)."""
    from ..core.errors import PlanError
    from ..recipe.loader import RecipeError, RecipeIssue
    from ..storage.atomic import same_file
    from ..storage.paths import given_path

    recipe = loaded.recipe
    assert recipe.sources is not None
    labels = [s.label for s in recipe.sources]
    if compared:
        given = given_path(value)
        if any(same_file(p, given) for p in loaded.source_paths):
            return recipe
        if "=" not in value:
            names = ", ".join(f"'{n}'" for n in labels)
            raise PlanError(f"{value} is none of the recipe's sources ({names}): give one of them, or NAME=PATH",
                            file=shown)
    name, sep, path = value.partition("=")
    if not sep or name not in labels or not path:
        problem = (f"unknown source name '{name}'" if sep and name not in labels
                   else f"this recipe has {len(labels)} sources: --source needs NAME=PATH")
        raise RecipeError([RecipeIssue(shown, 0, 0, "--source", problem,
                                       "the names are " + ", ".join(f"'{n}'" for n in labels))])
    i = labels.index(name)
    entries = list(recipe.sources)
    entries[i] = entries[i].model_copy(update={"path": given_path(path), "name": name})
    return recipe.model_copy(update={"sources": entries})


def _target_in(recipe: Any, given: str, path: Any) -> Any:
    """The recipe's target written to `given`. A folder (`DIR/`, or an existing folder) keeps the
    recipe's format: a Hugging Face folder for SafeTensors/PyTorch (the recipe's shards, else 5GB
    ones: one model.safetensors when it fits), for burnpack `DIR/<the recipe's file name>`. A
    target never changes format because of how --target is spelled."""
    from ..formats.registry import spec, target_format
    from ..storage.remote import is_url

    target = recipe.target
    folder = given.endswith(("/", os.sep)) or (not is_url(given) and os.path.isdir(given))
    if not folder:
        return target.model_copy(update={"path": path})
    fmt = target_format(target.path, target.format, sharded=target.shard is not None)
    if spec(fmt).folder:  # a DCP checkpoint: DIR is the checkpoint
        return target.model_copy(update={"path": path})
    if spec(fmt).shard_names is None:  # a format of one file per model (Burn's): the file goes into DIR
        name = os.path.basename(str(target.path).rstrip("/")) or "model" + spec(fmt).extension
        return target.model_copy(update={"path": os.path.join(str(path), name)})
    from ..recipe.model import ShardSpec

    shard = target.shard or ShardSpec.model_validate({})
    return target.model_copy(update={"path": path, "format": fmt, "shard": shard})


def plan_of(loaded: LoadedRecipe, *, recipe: Recipe | None = None, **options: Any) -> Plan:
    """`build_plan` of a loaded recipe file, given all the loader knows of it: its hash, and where its
    modules, ops and sources are written (an error names its recipe line, whichever command planned
    it). `recipe`: the file's recipe with a path replaced (`diff`'s A); `options`: `build_plan`'s."""
    file = RecipeFile(loaded.sha256, loaded.module_origins, loaded.op_origins, loaded.source_origins)
    plan = build_plan(loaded.recipe if recipe is None else recipe, loaded.base_dir, file=file, **options)
    plan.read_also = other_inputs(loaded)  # no output of the run may replace the recipe or its config
    return plan


@contextmanager
def open_plan(loaded: LoadedRecipe, *, hash_sources: bool = False, overwrite: bool | None = None,
              fsync: bool | None = None, limits: Limits = DEFAULT_LIMITS, shown: str | None = None) -> Iterator[Plan]:
    """The recipe's plan, open for the block, read within `limits` (the command line's `--limit`); a
    wrong `top_level_key` is named at its recipe line (`shown`: the recipe's path as given)."""
    try:
        plan = plan_of(loaded, hash_sources=hash_sources, overwrite=overwrite, fsync=fsync, limits=limits)
    except SourceKeyError as e:  # about one recipe value: name its line
        from ..recipe.loader import locate

        where = locate(loaded, e.loc, shown)
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

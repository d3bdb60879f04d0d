"""`migrate convert`: a one-off conversion that builds a recipe in memory and runs it.

Plain by default (every tensor, same names, same bytes): PyTorch index renumbering is off unless
asked for, and burnpack -> burnpack with nothing changed is byte-identical. `emit_recipe` gives the
YAML to check in, so a one-off can become a recipe.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import MigratorError
from .execute import run_plan
from .plan import Plan, build_plan
from .recipe import Recipe


class ConvertUsageError(MigratorError):
    """A convert option is malformed (e.g. --remap without '=')."""


@dataclass
class ConvertResult:
    source: str
    source_format: str
    target: str
    target_format: str
    tensors: int
    nbytes: int
    metadata: dict[str, str]
    scalars_written: int
    notes: list[str] = field(default_factory=list)


def build_recipe(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    source_format: str = "auto",
    target_format_name: str = "auto",
    top_level_key: str | None = None,
    remaps: Sequence[str] = (),
    includes: Sequence[str] = (),
    excludes: Sequence[str] = (),
    adapters: Sequence[str] = (),
    dtype: str | None = None,
    contiguous_indices: bool = False,
    overwrite: bool = False,
    fsync: bool = True,
    metadata: Mapping[str, str] | None = None,
    clear_metadata: bool = False,
) -> Recipe:
    """The recipe equivalent to a `migrate convert` command line (validated like any recipe)."""
    remap = []
    for item in remaps:
        pattern, sep, repl = item.partition("=")
        if not sep or not pattern:
            raise ConvertUsageError(f"--remap expects 'REGEX=REPLACEMENT', got {item!r}")
        remap.append({"from": pattern, "to": repl})
    data: dict[str, Any] = {
        "version": 1,
        "source": {"path": os.fspath(src), "format": source_format, "contiguous_indices": contiguous_indices},
        "remap": remap,
        "target": {"path": os.fspath(dst), "format": target_format_name, "overwrite": overwrite, "fsync": fsync,
                   "metadata": dict(metadata or {}), "clear_metadata": clear_metadata},
    }
    if top_level_key:
        data["source"]["top_level_key"] = top_level_key
    if includes or excludes:
        data["filter"] = {"include": [{"regex": r} for r in includes] or None,
                          "exclude": [{"regex": r} for r in excludes]}
    if adapters:
        data["adapters"] = list(adapters)
    if dtype:
        data["dtype"] = {"cast": dtype}
    return Recipe.model_validate(data)


def emit_recipe(recipe: Recipe) -> str:
    import yaml

    header = "# yaml-language-server: $schema=schemas/recipe.schema.json\n"
    return header + yaml.safe_dump(recipe.dump(), sort_keys=False, allow_unicode=True)


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, progress: bool | None = None,
            **options: Any) -> ConvertResult:
    """Convert `src` to `dst` atomically, one tensor at a time (see `build_recipe` for options)."""
    recipe = build_recipe(src, dst, **options)
    with build_plan(recipe, Path.cwd()) as plan:
        result = run_plan(plan, progress=progress)
        return _result(plan, result.target)


def _result(plan: Plan, written: str) -> ConvertResult:
    return ConvertResult(
        source=str(plan.source_path), source_format=plan.source_format, target=written,
        target_format=plan.target_format, tensors=len(plan.entries),
        nbytes=sum(e.tensor.nbytes for e in plan.entries), metadata=plan.metadata,
        scalars_written=len(plan.scalars), notes=plan.notes,
    )

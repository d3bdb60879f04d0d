"""`migrator.run_recipe`: what `migrate run` does, for Python callers, returning the report."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .core.errors import MigratorError

if TYPE_CHECKING:
    from .plan.report import ApplyReport
    from .recipe.model import Recipe


class RecipeRunError(MigratorError):
    """A recipe's run wrote nothing (missing tensors, shape mismatches, a failed write); `report`
    is the run's report, with `status` "failed" and the problems in `errors`."""

    def __init__(self, message: str, *, report: ApplyReport, file: str | None = None) -> None:
        super().__init__(message, file=file)
        self.report = report


def run_recipe(recipe: str | os.PathLike[str] | Recipe | dict[str, Any], *, overwrite: bool | None = None,
               base_dir: str | os.PathLike[str] | None = None, fsync: bool | None = None,
               hash_sources: bool = False, progress: bool = False,
               source: str | os.PathLike[str] | None = None, target: str | os.PathLike[str] | None = None,
               config: str | os.PathLike[str] | None = None, training_state: str | None = None) -> ApplyReport:
    """Run a recipe file (or a `Recipe`, or its dict) and return its `ApplyReport`.

    Paths in a recipe file are relative to its folder; a `Recipe` object's are relative to
    `base_dir` (default: the current folder). `overwrite`/`fsync` override the recipe's target
    settings when given. `source`, `target`, `config` and `training_state` are `migrate run`'s
    `--source`, `--target`, `--config` and `--training-state` (paths from the current folder): a
    recipe run on another model reads its `${config...}` values from that model's config. An invalid
    recipe raises `RecipeError`; a run that writes nothing raises `RecipeRunError`, whose `report`
    says why.
    """
    from .recipe.model import Recipe as RecipeModel
    from .run.recipe import RunOptions
    from .run.recipe import run_recipe as engine

    if not isinstance(recipe, str | os.PathLike | RecipeModel):
        recipe = RecipeModel.model_validate(recipe)
    def path(p: str | os.PathLike[str] | None) -> str | None:
        return None if p is None else os.fspath(p)

    options = RunOptions(overwrite=overwrite, fsync=fsync, hash_sources=hash_sources, progress=progress,
                         base_dir=path(base_dir), source=path(source), target=path(target), config=path(config),
                         training_state=training_state)
    outcome = engine(recipe, options)  # as `migrate run` runs it: errors name their recipe line
    report = outcome.concluded
    if outcome.invalid or report is None:  # the recipe did not load, or nothing was planned
        assert outcome.error is not None
        raise outcome.error
    if outcome.written is None:
        why = outcome.error or outcome.failure
        detail = why.detail if why is not None else outcome.document["error"]["message"]
        raise RecipeRunError(detail, report=report, file=outcome.target)
    return report

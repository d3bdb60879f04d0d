"""`migrator.run_recipe`: what `migrate run` does, for Python callers, returning the report."""

from __future__ import annotations

import os
from pathlib import Path
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
               hash_sources: bool = False, progress: bool = False) -> ApplyReport:
    """Run a recipe file (or a `Recipe`, or its dict) and return its `ApplyReport`.

    Paths in a recipe file are relative to its folder; a `Recipe` object's are relative to
    `base_dir` (default: the current folder). `overwrite`/`fsync` override the recipe's target
    settings when given. An invalid recipe raises `RecipeError`; a run that writes nothing raises
    `RecipeRunError`, whose `report` says why.
    """
    from .plan.build import build_plan
    from .plan.report import ReportError
    from .recipe.model import Recipe as RecipeModel
    from .run.execute import run_plan

    options: dict[str, Any] = dict(hash_sources=hash_sources, overwrite=overwrite, fsync=fsync)
    if isinstance(recipe, str | os.PathLike):  # as `migrate run` plans it: errors name their recipe line
        from .plan.loaded import plan_of
        from .recipe.loader import load_recipe

        planned = plan_of(load_recipe(recipe), **options)
    else:
        model = recipe if isinstance(recipe, RecipeModel) else RecipeModel.model_validate(recipe)
        planned = build_plan(model, Path(base_dir) if base_dir is not None else Path.cwd(), **options)
    with planned as plan:
        report = plan.report
        report.target = str(plan.target_path)
        try:
            result = run_plan(plan, progress=progress)
        except MigratorError as e:
            known = {str(x) for x in report.errors}
            report.errors += [ReportError(str(plan.target_path), "run_error", m, None, None)
                              for m in [*plan.fatal, *([] if plan.fatal else [str(e)])] if m not in known]
            report.status, report.written = "failed", False
            raise RecipeRunError(str(e.detail), report=report, file=str(plan.target_path)) from None
        report.target, report.status, report.written = result.target, "ok", True
        return report

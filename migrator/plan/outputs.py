"""Every file a run writes, as one list: the model (a file, or a folder holding its shards and the
companion files copied into it), Burn's optimizer record beside a `.bpk` model (`training_state:
keep`), and the `--report`.

The list comes from a built plan (`plan_outputs`: what the run will write) or from the recipe alone,
before any file is opened (`recipe_outputs`: what it may write, for the checks of many jobs against
each other, `run/jobs.py`; a record is listed whenever one may be written, since whether the source
holds an optimizer is known only once it is opened). The engine's checks (`run/execute.py`,
`run/recipe.py`) and the jobs' take their outputs from here, so an output added to a run is checked
everywhere at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..recipe.model import Recipe


@dataclass(frozen=True)
class Output:
    """One file (or folder) a run writes: `role` is "target", "record", "scheduler" or "report"."""

    role: str
    path: str
    folder: bool = False

    def describe(self) -> str:
        return {"target": "its target", "record": "its Burn optimizer record",
                "scheduler": "its Burn LR scheduler record", "report": "its --report"}[self.role] \
            + f" {self.path}"


def record_file(model: str | os.PathLike[str], optimizer: str | os.PathLike[str] | None) -> str:
    """Where Burn's optimizer record of the model `model` goes: `optimizer` (target.optimizer,
    --optimizer-out), else `<stem>-optim.bpk` beside it; `.bpk` appended as for any burnpack."""
    from ..formats.burnpack import BurnpackWriter
    from .burn_optimizer import default_record_path

    return BurnpackWriter.resolve_path(optimizer if optimizer is not None else default_record_path(Path(model)))


def recipe_outputs(recipe: Recipe, resolve: Callable[[Any], str], *, target: str | None = None,
                   training_state: str | None = None, report: str | None = None) -> list[Output]:
    """What a run of `recipe` may write, from the recipe alone (`resolve`: a recipe path as the run
    resolves it; `target` / `training_state`: the command line's, in place of the recipe's)."""
    from ..core.errors import MigratorError
    from ..files.io import writer_class
    from ..formats.registry import is_format, target_format

    path = target if target else resolve(recipe.target.path)
    folder = (recipe.target.shard is not None or str(path).endswith(("/", os.sep))
              or is_format(recipe.target.format, folder=True))  # a DCP checkpoint
    fmt = None
    if not folder:
        with suppress(MigratorError):
            fmt = target_format(path, recipe.target.format)
            path = writer_class(fmt).resolve_path(path)
    out = [Output("target", str(path), folder)]
    if is_format(fmt, for_burn=True) and (training_state or recipe.training_state) == "keep":
        optimizer = None if recipe.target.optimizer is None else resolve(recipe.target.optimizer)
        out.append(Output("record", record_file(path, optimizer)))
        from .burn_scheduler import default_scheduler_path

        out.append(Output("scheduler", str(default_scheduler_path(Path(path)))))
    if report:
        out.append(Output("report", report))
    return out


def plan_outputs(plan: Any, report: str | os.PathLike[str] | None = None) -> list[Output]:
    """What a run of the built `plan` (`build.Plan`: not imported, which would lengthen the longest
    import chain of `tests/test_layers.py`) writes: its target (a folder for a sharded writer), Burn's
    optimizer record when the plan has one, and `report`."""
    from ..formats.base import WriterKind

    folder = plan.writer is not None and plan.writer.kind is WriterKind.FOLDER
    target = str(plan.target_path) if folder or plan.writer is None else plan.writer.resolve_path(plan.target_path)
    out = [Output("target", target, folder)]
    if plan.record is not None and plan.record_path is not None:
        out.append(Output("record", plan.record.resolve_path(plan.record_path)))
    if plan.scheduler is not None and plan.scheduler_path is not None:
        out.append(Output("scheduler", plan.scheduler.resolve_path(plan.scheduler_path)))
    if report:
        out.append(Output("report", os.fspath(report)))
    return out

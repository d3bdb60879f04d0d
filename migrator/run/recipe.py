"""The engine: one recipe run, as a value. Every way of running a recipe comes here.

`run_recipe(recipe, RunOptions)` loads the recipe (`plan/loaded.py`: the command line's paths in
place of its own), plans it, refuses before writing what a write would refuse, writes the output
(with the workers `runner_for` picks), publishes it, writes the `--report`, and returns what
happened (`RunOutcome`: the report, what was written, the notes, the error if any). It prints
nothing: `migrate run` turns the outcome into its text or JSON (`cli/recipe.py`).

Its callers: `migrate run` of one recipe; each of many jobs (`jobs.py`, in a worker process or a
Ray task: the outcome is sent back whole); `migrator.run_recipe`; and, with `use=` (the open plan
is handed to a function instead of being written), each Ray write task re-planning its job
(`ray_executor.py`) and `migrate diff --recipe` (the plan compared with B).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import EXIT_MIGRATION, EXIT_OK, EXIT_USAGE, MigratorError, error_json
from ..core.limits import DEFAULT_LIMITS, Limits
from ..formats.base import WriterKind
from ..plan.build import Plan
from ..plan.document import plan_error, plan_json
from ..storage.remote import is_url

if TYPE_CHECKING:
    from ..plan.report import ApplyReport
    from ..recipe.loader import LoadedRecipe
    from ..recipe.model import Recipe
    from .execute import RunResult
    from .parallel_write import Runner


@dataclass(frozen=True)
class RunOptions:
    """How one recipe runs, as a value (what `migrate run`'s options, a job's or an API call's say).

    `source`/`target` replace the recipe's paths (from the current folder); `overwrite`/`fsync`: None
    keeps the recipe's `target:` setting; `progress`: None draws a bar when stderr is a terminal;
    `workers` (or `jobs` of one job) write one output; `one_of_many`: the run is one job of several,
    so `jobs` is how many run at once, not this one's workers; `report`: also write the `--report`
    there; `compared`: the plan is compared, never written (`diff --recipe`: `source` is A);
    `base_dir`: where a `Recipe` object's relative paths start (default: the current folder)."""

    source: str | None = None
    target: str | None = None
    config: str | None = None
    training_state: str | None = None  # --training-state, in place of the recipe's
    overwrite: bool | None = None
    fsync: bool | None = None
    hash_sources: bool = False
    progress: bool | None = False
    workers: int | None = None
    jobs: int | None = None
    executor: str | None = None
    ray_address: str | None = None
    reader_limits: Limits = DEFAULT_LIMITS
    one_of_many: bool = False
    report: str | None = None
    compared: bool = False
    base_dir: str | None = None

    def overrides(self) -> dict[str, str]:
        """{"source": PATH, "target": PATH, "config": FILE, "training_state": keep|drop} as given (any may be
        absent)."""
        return {k: v for k, v in (("source", self.source), ("target", self.target), ("config", self.config),
                                  ("training_state", self.training_state)) if v}

    def plan_settings(self) -> dict[str, Any]:
        """`plan.loaded.open_plan`'s settings (`migrate plan | validate` plan a recipe this way)."""
        return {"overwrite": self.overwrite, "fsync": self.fsync, "limits": self.reader_limits}


@dataclass(frozen=True)
class RunOutcome:
    """What one recipe's run did. `code`: the exit code; `document`: `run --json`'s (the report,
    errors, notes; or the error); `report`: the `--report` document (`report_of`: also when the
    recipe did not load or was refused, for a report of many jobs).

    `error`: why nothing was planned or the plan was refused before writing (`invalid`: the recipe
    did not load); `failure`: the write failed (nothing published); `report_error`: the output was
    published but the `--report` was not written. `planned` is the plan's report as planned (its
    summary is `planned.display()`) and `unlisted` the plan's problems that summary does not list;
    `concluded` the report as the run ended (`ApplyReport.concluded`); `written` what was published;
    `value` what `use` returned."""

    code: int
    document: dict[str, Any]
    report: dict[str, Any]
    error: MigratorError | None = None
    invalid: bool = False
    planned: ApplyReport | None = field(default=None, repr=False)
    unlisted: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    concluded: ApplyReport | None = field(default=None, repr=False)
    failure: MigratorError | None = None
    report_error: MigratorError | None = None
    target: str = ""
    target_format: str = ""
    written: RunResult | None = None
    value: Any = None


def run_recipe(recipe: str | os.PathLike[str] | Recipe, options: RunOptions = RunOptions(), *,
               use: Callable[[Plan], Any] | None = None) -> RunOutcome:
    """Run one recipe (a file, or a `Recipe` object) and say what happened; prints nothing. With
    `use`, the open plan is given to `use` instead of being written (its result is `value`)."""
    from ..recipe.issues import RecipeError

    try:
        loaded = _load(recipe, options)
    except RecipeError as e:
        return _refused(e, invalid=True)
    plan: Plan | None = None
    try:
        with _planned(recipe, loaded, options) as plan:
            if use is not None:
                return RunOutcome(EXIT_OK, {}, {}, value=use(plan), target=str(plan.target_path),
                                  target_format=plan.target_format)
            return _write(plan, loaded, recipe, options)
    except MigratorError as e:  # not planned, or refused before anything was written
        return _refused(e, plan=plan)


def _load(recipe: str | os.PathLike[str] | Recipe, options: RunOptions) -> LoadedRecipe | None:
    from ..plan.loaded import load

    if not isinstance(recipe, str | os.PathLike):
        if options.overrides():
            raise ValueError("--source/--target replace a recipe file's paths: give the recipe's own")
        return None
    return load(recipe, options.overrides(), compared=options.compared,
                shown=os.fspath(recipe) if options.compared else None)


@contextmanager
def _planned(recipe: Any, loaded: LoadedRecipe | None, options: RunOptions) -> Iterator[Plan]:
    settings: dict[str, Any] = dict(hash_sources=options.hash_sources, overwrite=options.overwrite,
                                    fsync=options.fsync, limits=options.reader_limits)
    if loaded is None:  # a Recipe object: its paths from `base_dir`
        from ..plan.build import build_plan

        base = Path(options.base_dir) if options.base_dir is not None else Path.cwd()
        with build_plan(recipe, base, **settings) as plan:
            yield plan
        return
    from ..plan.loaded import open_plan

    with open_plan(loaded, **settings) as plan:
        yield plan


def _write(plan: Plan, loaded: LoadedRecipe | None, recipe: Any, options: RunOptions) -> RunOutcome:
    """The planned run: refuse what the writes would refuse, write, publish, then the report."""
    from ..plan.outputs import plan_outputs
    from ..storage.atomic import check_target
    from .execute import check_plan_target, read_by, run_plan

    report_path = Path(options.report) if options.report else None
    outputs = [report_path] if report_path else []
    # Everything the writes would refuse is refused before anything is written.
    check_plan_target(plan)
    if report_path:  # not a file the run reads, not an output (by path or inode), not over a file
        check_target(report_path, overwrite=plan.overwrite, protect=read_by(plan),
                     outputs=[o.path for o in plan_outputs(plan)])
        if plan.writer is not None and plan.writer.kind is WriterKind.FOLDER:  # nor inside the output folder
            from ..storage.atomic_folder import check_folder_distinct

            check_folder_distinct(plan.target_path, outputs=outputs)
    result = None
    failure: MigratorError | None = None
    if plan.ok:
        runner = runner_for(options, plan, loaded, recipe)
        try:
            result = run_plan(plan, progress=False if runner is not None else options.progress, outputs=outputs,
                              runner=runner)
        except MigratorError as e:  # the write failed (disk full, source truncated...): nothing published
            failure = e
    problems = [*plan.fatal, *([str(failure)] if failure else [])]
    concluded = plan.report.concluded(str(plan.target_path), problems, result.target if result else None)
    error = plan_error(plan) or ({"error": {"kind": "OutputError", "message": str(failure),
                                            "file": str(plan.target_path), "tensor": None}} if failure else {})
    document = {"report": _report_json(concluded, plan), "errors": problems, "notes": list(plan.notes), **error}
    report = _report_json(concluded, plan, options.overrides())
    report_error = None
    if report_path:
        try:
            write_report(report_path, plan, report)
        except MigratorError as e:
            report_error = e
    shown = {str(e) for e in plan.report.displayed_errors()}  # listed in the summary
    return RunOutcome(EXIT_OK if result is not None and report_error is None else EXIT_MIGRATION, document, report,
                      planned=plan.report, unlisted=tuple(p for p in plan.fatal if p not in shown),
                      notes=tuple(plan.notes), concluded=concluded, failure=failure, report_error=report_error,
                      target=str(plan.target_path), target_format=plan.target_format, written=result)


def _refused(e: MigratorError, *, invalid: bool = False, plan: Plan | None = None) -> RunOutcome:
    """Nothing planned (`invalid`: the recipe did not load), or the plan refused before writing."""
    concluded = None if plan is None else plan.report.concluded(str(plan.target_path), [str(e)], None)
    return RunOutcome(e.exit_code, {"error": error_json(e)}, report_of(e.exit_code, error_json(e)), error=e,
                      invalid=invalid, concluded=concluded, target="" if plan is None else str(plan.target_path))


def report_of(code: int, error: dict[str, Any]) -> dict[str, Any]:
    """The `--report` of a run that planned nothing (its recipe is invalid, a source unreadable, its
    worker died): status "invalid" (exit 2) or "failed", nothing written, its error."""
    return {"status": "invalid" if code == EXIT_USAGE else "failed", "written": False,
            "errors": [{"kind": error.get("kind", "error"), "message": error.get("message", "")}]}


def _report_json(concluded: ApplyReport, plan: Plan, overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The `--report` JSON: the concluded report; with `--source` / `--target`, also `"overrides"`:
    the paths as given and the `source` read."""
    doc = concluded.to_json()
    if plan.structure_notes:  # a PyTorch -> PyTorch run kept the checkpoint's structure: what it kept
        doc["checkpoint_structure"] = list(plan.structure_notes)
    if overrides:
        doc["source"] = str(plan.source_path)
        doc["overrides"] = dict(overrides)
    return doc


def write_report(path: Path, plan: Plan, doc: dict[str, Any]) -> None:
    """Written through the same atomic path as the output, after it: never onto a file the run
    read or wrote, never over an existing file without overwrite."""
    from ..analysis.html_report import is_html_path, plan_page
    from ..core.display import json_text
    from ..plan.outputs import plan_outputs
    from ..storage.atomic import write_file
    from .execute import read_by

    data = plan_page(plan_json(plan), doc) if is_html_path(path) else (json_text(doc) + "\n").encode()
    write_file(path, data, overwrite=plan.overwrite, protect=read_by(plan),
               outputs=[o.path for o in plan_outputs(plan)], fsync=plan.fsync, mode_from=plan.source_modes(),
               make_folders=True)


URL_TARGET_SERIAL = ("an object-store target is uploaded by this process, its parts in parallel: "
                     "--workers and --executor ray split the writing of local targets only")


def runner_for(options: RunOptions, plan: Plan, loaded: LoadedRecipe | None, recipe: Any) -> Runner | None:
    """The workers that write one job's output: `--workers W` (or `--jobs W` for one job) threads, or
    Ray tasks with `--executor ray`, each re-planning the job (`run_recipe` with `use=`); None (this
    thread, as always) otherwise or when the output cannot be split (a single PyTorch file)."""
    from .parallel_write import LocalRunner, can_split

    workers = options.workers or (options.jobs if not options.one_of_many else None)
    if not can_split(plan.writer):
        return None
    model = loaded.recipe if loaded is not None else recipe
    executor, address = executor_for(options.executor, options.ray_address, model)
    if is_url(plan.target_path):  # one job to a store: the driver uploads it (parts already in flight)
        if executor == "ray" or (workers and workers > 1):
            plan.notes.append(URL_TARGET_SERIAL)
        return None
    if executor == "ray":
        from ..storage.paths import where
        from .ray_executor import RayRunner

        source, target = options.source, options.target
        job_options = replace(options, executor="local", report=None, progress=False,
                              source=where(source) if source else None, target=where(target) if target else None)
        # each task re-plans the job with this function (passed, not imported: the runner is below it)
        return RayRunner({"recipe": str(loaded.path.absolute()) if loaded is not None else recipe,
                          "options": job_options, "engine": run_recipe}, workers, address)
    if workers and workers > 1:
        return LocalRunner(workers)
    return None


def executor_for(given: str | None, address: str | None, recipe: Recipe | None) -> tuple[str, str | None]:
    """(executor, Ray address) of one run: `--executor`/`--ray-address` (`given`, `address`) when
    given, else the recipe's `executor:`, else this machine."""
    ray = recipe.executor.ray if recipe is not None and recipe.executor is not None else None
    executor = given or ("ray" if ray is not None else "local")
    return executor, address or (ray.address if ray is not None and executor == "ray" else None)

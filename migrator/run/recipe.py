"""`migrate run` of one recipe: load it, plan it, refuse before writing what a write would refuse,
write the output (with the workers `runner_for` picks), publish it, then the report.

`migrate run`, each of many jobs (`jobs.py`, in a worker process or a Ray task) and its text and
JSON output come from `run_one_recipe`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.display import count, escape, human_bytes
from ..core.errors import EXIT_MIGRATION, EXIT_OK, EXIT_USAGE, MigratorError, error_json
from ..core.limits import DEFAULT_LIMITS, Limits
from ..formats.base import WriterKind
from ..plan.build import Plan
from ..plan.document import plan_error, plan_json
from ..plan.loaded import load, open_plan, overrides_of
from ..storage.remote import is_url
from .job_spec import JOB_OPTIONS, is_many, where

if TYPE_CHECKING:
    from .parallel_write import Runner


@dataclass(frozen=True)
class RunOptions:
    """How one recipe runs: `migrate run`'s options (or a job's), as a value. `source`/`target`
    replace the recipe's paths; `one_of_many`: the run is one job of several, so `jobs` is how many
    run at once, not this one's workers."""

    source: str | None = None
    target: str | None = None
    overwrite: bool = False
    no_fsync: bool = False
    hash_sources: bool = False
    json: bool = False
    no_progress: bool = False
    workers: int | None = None
    jobs: int | None = None
    executor: str | None = None
    ray_address: str | None = None
    reader_limits: Limits = DEFAULT_LIMITS
    one_of_many: bool = False

    @classmethod
    def of(cls, args: Any) -> RunOptions:
        """From the command line's namespace (or a job's): the attributes it has and sets."""
        given = {f.name: getattr(args, f.name, None) for f in fields(cls) if f.name != "one_of_many"}
        return cls(**{k: v for k, v in given.items() if v is not None}, one_of_many=is_many_ns(args))


@dataclass
class RunOutcome:
    """One recipe's run: its exit code, its `run --json` document and its `--report` document (None
    when the recipe did not load)."""

    code: int
    document: dict[str, Any]
    report: dict[str, Any] | None = None


def run_one_recipe(path: str, args: RunOptions, report_path: Path | None = None,
               runner: Any = None) -> RunOutcome:
    """Run one recipe, printing its text output (none under `--json`: the caller prints `document`);
    with `report_path`, write its report there. `runner`: the workers that write the output
    (`migrator.run.parallel_write`; None: this thread). A MigratorError while planning propagates."""
    from ..recipe.loader import RecipeError
    from ..storage.atomic import check_target
    from .execute import check_plan_target, read_by, run_plan

    try:
        loaded = load(path, args)
    except RecipeError as e:
        if not args.json:
            print(f"migrate: invalid recipe:\n{escape(e, keep_newlines=True)}", file=sys.stderr)
        return RunOutcome(EXIT_USAGE, {"error": error_json(e)})
    with open_plan(loaded, args) as plan:
        # Everything the writes would refuse is refused before anything is written.
        outputs = [report_path] if report_path else []
        check_plan_target(plan)
        if report_path:  # not a file the run reads, not the target (by path or inode), not over a file
            check_target(report_path, overwrite=plan.overwrite, protect=read_by(plan), outputs=[plan.target_path])
            if plan.writer is not None and plan.writer.kind is WriterKind.FOLDER:  # nor inside the output folder
                from ..storage.atomic_folder import check_folder_distinct

                check_folder_distinct(plan.target_path, outputs=outputs)
        result = None
        failure: str | None = None
        if plan.ok:
            if runner is None:
                runner = runner_for(args, plan, loaded)
            try:
                result = run_plan(plan, progress=False if args.no_progress or runner is not None else None,
                                  outputs=outputs, runner=runner)
            except MigratorError as e:  # the write failed (disk full, source truncated...): nothing published
                failure = str(e)
        # The summary comes after the output is published, never before; a failed write has none
        # (it would list as applied what was not written): its error follows.
        errors = plan.fatal + ([failure] if failure else [])
        error = plan_error(plan) or ({"error": {"kind": "OutputError", "message": failure,
                                                 "file": str(plan.target_path), "tensor": None}}
                                      if failure else {})
        document = {"report": report_document(plan, failure, result.target if result else None),
                    "errors": errors, "notes": plan.notes, **error}
        report = report_document(plan, failure, result.target if result else None, overrides_of(args))
        outcome = RunOutcome(EXIT_OK if result is not None else EXIT_MIGRATION, document, report)
        if not args.json and failure is None:
            print_outcome(plan)
        if failure:
            print(f"migrate: error: {escape(failure, keep_newlines=True)}", file=sys.stderr)
        if report_path:
            try:
                write_report(report_path, plan, report)
            except MigratorError as e:
                done = f"wrote {result.target}, but " if result else ""
                print(f"migrate: error: {done}the report was not written: {e}", file=sys.stderr)
                outcome.code = EXIT_MIGRATION
                return outcome
        if result is None:
            print(f"migrate: nothing written to {escape(plan.target_path)}", file=sys.stderr)
            return outcome
        if not args.json:
            print(f"wrote {escape(result.target)} ({plan.target_format}): {count(result.tensors, 'tensor')}, "
                  f"{human_bytes(result.nbytes)}")
    return outcome


def print_outcome(plan: Plan) -> None:
    print(plan.report.display())  # escapes the names it shows
    for note in plan.notes:
        print(f"note: {escape(note, keep_newlines=True)}")
    shown = {str(e) for e in plan.report.displayed_errors()}  # listed in the summary just printed
    for problem in plan.fatal:
        if problem not in shown:
            print(f"error: {escape(problem, keep_newlines=True)}", file=sys.stderr)


def report_document(plan: Plan, failure: str | None = None, written: str | None = None,
                    overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The `--report` JSON: the apply report, the target and whether the run published it; with
    `--source` / `--target`, also `"overrides"`: the paths as given and the `source` read.

    A failed run says so: `status` is "failed" and every problem that stopped it is in `errors`
    (as a `run_error` when the apply report has no entry for it), never `"errors": []`.
    """
    doc = plan.report.to_json()
    problems = list(plan.fatal) + ([failure] if failure else [])
    known = {str(e) for e in plan.report.errors}
    doc["errors"] += [{"path": str(plan.target_path), "kind": "run_error", "message": m, "expected": None,
                       "found": None} for m in problems if m not in known]
    ok = not problems
    doc["status"] = "ok" if ok else "failed"
    doc["target"] = written if ok and written else str(plan.target_path)
    doc["written"] = ok
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
    from ..storage.atomic import write_file
    from .execute import read_by, source_modes

    data = plan_page(plan_json(plan), doc) if is_html_path(path) else (json_text(doc) + "\n").encode()
    write_file(path, data, overwrite=plan.overwrite, protect=read_by(plan),
               outputs=[plan.target_path], fsync=plan.fsync, mode_from=source_modes(plan), make_folders=True)


URL_TARGET_SERIAL = ("an object-store target is uploaded by this process, its parts in parallel: "
                     "--workers and --executor ray split the writing of local targets only")


def runner_for(args: RunOptions, plan: Plan, loaded: Any) -> Runner | None:
    """The workers that write one job's output: `--workers W` (or `--jobs W` for one job) threads, or
    Ray tasks with `--executor ray`; None (this thread, as always) otherwise or when the output
    cannot be split (a single PyTorch file)."""
    from .parallel_write import LocalRunner, can_split

    workers = args.workers or (args.jobs if not args.one_of_many else None)
    if not can_split(plan.writer):
        return None
    if is_url(plan.target_path):  # one job to a store: the driver uploads it (parts already in flight)
        if executor_for(args, loaded.recipe)[0] == "ray" or (workers and workers > 1):
            plan.notes.append(URL_TARGET_SERIAL)
        return None
    executor, address = executor_for(args, loaded.recipe)
    if executor == "ray":
        from .ray_executor import RayRunner

        spec = {"recipe": str(loaded.path.absolute()), **{k: getattr(args, k) for k in JOB_OPTIONS},
                "source": where(args.source) if args.source else None,
                "target": where(args.target) if args.target else None}
        return RayRunner(spec, workers, address)
    if workers and workers > 1:
        return LocalRunner(workers)
    return None


def is_many_ns(args: Any) -> bool:
    """Whether a namespace is one job of several (a job's has no `recipes`)."""
    recipes = getattr(args, "recipes", None)
    return recipes is None or is_many(args)


def executor_for(args: Any, recipe: Any) -> tuple[str, str | None]:
    """(executor, Ray address) of one run: `--executor`/`--ray-address` when given, else the recipe's
    `executor:`, else this machine."""
    spec = getattr(recipe, "executor", None)
    ray = spec.ray if spec is not None else None
    given = getattr(args, "executor", None)
    executor = given or ("ray" if ray is not None else "local")
    address = getattr(args, "ray_address", None) or (ray.address if ray is not None and executor == "ray" else None)
    return executor, address

"""`migrate run | plan | validate | schema`: recipes from the command line.

Exit codes: 0 success, 1 migration errors (missing tensors, shape mismatches, unreadable files),
2 invalid recipe or usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..core.display import RICH_TABLE_ROWS, clip_words, count, escape, human_bytes, print_table
from ..core.errors import EXIT_MIGRATION, EXIT_OK, EXIT_USAGE, MigratorError, error_json
from .options import NO_FSYNC_HELP, add_limit_option, command, positive

if TYPE_CHECKING:  # the plan and the run are imported by the commands, not by `migrate --help`
    from ..plan.build import Plan
    from ..run.jobs import JobResult
    from ..run.recipe import RunOptions, RunOutcome


def add_path_overrides(parser: argparse.ArgumentParser, scope: str = "", target_also: str = "") -> None:
    """`--source`/`--target`/`--config` in place of the recipe's paths (`plan.loaded.with_paths` applies
    them)."""
    parser.add_argument("--source", metavar="PATH", help=f"{scope}read PATH instead of the recipe's source.path "
                        "(relative to the current folder)")
    parser.add_argument("--target", metavar="PATH", help=f"{scope}write PATH instead of the recipe's target.path "
                        f"(relative to the current folder){target_also}")
    parser.add_argument("--config", metavar="FILE", help=f"{scope}take ${{config.KEY}} values from FILE (a "
                        "config.json or params.json, relative to the current folder) instead of the recipe's "
                        "config: or the config beside the source")
    from ..recipe.convert_options import TRAINING_STATES

    parser.add_argument("--training-state", choices=TRAINING_STATES, default=None,
                        help=f"{scope}instead of the recipe's training_state: keep a training checkpoint's "
                        "optimizer state, rewritten to follow the recipe (a .pt target; a .bpk target gets Burn's "
                        "optimizer record beside it), or drop it")


def add_run_parser(sub: Any) -> argparse.ArgumentParser:
    run = command(sub, "run", "run recipes: plan, stream, write atomically, report",
                   "Run a recipe: plan it, stream every tensor into the target, publish it atomically, print "
                   "the\nloading summary. Exit 0 success, 1 migration error, 2 invalid recipe.\n"
                   "Several recipes, or one recipe over --each sources, are jobs run in parallel processes "
                   "(--jobs);\neach is atomic and reported, one failing does not stop the others, the exit "
                   "code is the worst.\n--target placeholders with --each: {stem} (file name without its last "
                   "extension), {name}\n(file name), {parent} (name of its folder), {i} (position among the "
                   "sorted matches, from 0).",
                   "  migrate run recipes/mlp-to-burn.yaml\n"
                   "  migrate run r.yaml --overwrite --report report.json --json\n"
                   "  migrate run a.yaml b.yaml c.yaml --jobs 2 --report all.json\n"
                   "  migrate run r.yaml --each 'runs/*/last.pt' --target 'out/{parent}-{stem}.bpk'\n"
                   "  migrate run big.yaml --workers 2            # one job, its tensors or shards by 2 workers")
    run.add_argument("recipes", nargs="+", metavar="recipe", help="recipe YAML files (several: one job each)")
    run.add_argument("--report", metavar="FILE", help="also write the report: JSON, or a self-contained HTML page "
                     "when FILE ends in .html (several jobs: JSON, one document with every job)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing target")
    run.add_argument("--no-fsync", action="store_true", help=NO_FSYNC_HELP)
    run.add_argument("--hash-sources", action="store_true", help="record the sources' sha256 in the metadata")
    run.add_argument("--json", action="store_true", help="print the report (or the error) as JSON")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_path_overrides(run, target_also="; with --each, a pattern with placeholders")
    run.add_argument("--each", nargs="+", metavar="GLOB", help="run the one recipe once per matching source "
                     "(quoted globs, ** recursive, or paths), writing --target with its placeholders filled in")
    run.add_argument("--jobs", type=positive, metavar="N", help="jobs run at once, each in its own process "
                     "(default: the CPUs available; 1: one after the other, each in its own process); with one job: "
                     "--workers")
    run.add_argument("--workers", type=positive, metavar="W", help="write one job's output with W workers: "
                     "disjoint ranges of one .bpk/.safetensors file, or whole shards of a folder (default 1)")
    run.add_argument("--executor", choices=("local", "ray"), default=None,
                     help="where jobs and write tasks run: here (default), or as Ray tasks (pip install "
                     "'migrator[ray]'; paths must be on storage every node sees); wins over the recipe's executor:")
    run.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster to join (default: $RAY_ADDRESS, "
                     "else a local Ray started for the run)")
    add_limit_option(run)
    return run


def add_plan_parser(sub: Any) -> argparse.ArgumentParser:
    plan = command(sub, "plan", "show what a recipe would do (names, ops, dtypes, shapes); write nothing",
                    "Show what a recipe would do, tensor by tensor (source and target names, module, ops, "
                    "dtypes,\nshapes, sizes), and the loading summary; writes nothing. Recipes with "
                    "`predicate` filters\nimport and run that code.",
                    "  migrate plan recipes/mlp-to-burn.yaml\n"
                    "  migrate plan r.yaml --json | jq '.entries[] | .target'")
    plan.add_argument("recipe", help="the recipe YAML file")
    plan.add_argument("--json", action="store_true", help="print the plan (or the error) as JSON")
    plan.add_argument("--html", metavar="FILE", help="write the plan as a self-contained HTML page instead of "
                      "the table")
    plan.add_argument("--overwrite", action="store_true", help="check the target as `run --overwrite` would "
                      "(and replace an existing HTML page)")
    add_path_overrides(plan)
    add_limit_option(plan)
    return plan


def add_validate_parser(sub: Any) -> argparse.ArgumentParser:
    val = command(sub, "validate", "validate recipes and check their sources parse (headers only)",
                   "Check recipes (schema, regexes, paths) and that their sources parse (headers only), "
                   "for CI.\nRecipes with `predicate` filters import and run that code. Exit code: the "
                   "worst of all recipes.",
                   "  migrate validate recipes/*.yaml\n"
                   "  migrate validate a.yaml b.yaml --json")
    val.add_argument("recipes", nargs="+", help="recipe YAML files")
    val.add_argument("--json", action="store_true", help="print one JSON document with a result per recipe")
    val.add_argument("--overwrite", action="store_true", help="check the targets as `run --overwrite` would")
    add_path_overrides(val, "(one recipe only) ")
    add_limit_option(val)
    return val


def add_schema_parser(sub: Any) -> argparse.ArgumentParser:
    sch = command(sub, "schema", "print the recipe JSON Schema",
                   "Print the recipe JSON Schema (for editors: yaml-language-server, VS Code).",
                   "  migrate schema -o recipe.schema.json\n"
                   "  migrate schema | jq '.properties | keys'")
    sch.add_argument("-o", "--output", metavar="FILE", help="write it to FILE (atomically) instead of stdout")
    sch.add_argument("--overwrite", action="store_true", help="replace an existing FILE")
    return sch



def _recipe_error(e: Exception, args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        from ..core.display import print_json
        print_json({"error": error_json(e)})
    else:
        print(f"migrate: invalid recipe:\n{escape(e, keep_newlines=True)}", file=sys.stderr)
    return EXIT_USAGE


def options_of(args: argparse.Namespace) -> RunOptions:
    """The frozen options of `migrate run | plan | validate` (what goes below the command line):
    the paths that replace a recipe's, and the settings each command has (absent ones unset)."""
    from ..core.limits import DEFAULT_LIMITS
    from ..run.recipe import RunOptions

    def given(name: str) -> Any:
        return getattr(args, name, None)

    return RunOptions(source=given("source"), target=given("target"), config=given("config"),
                      training_state=given("training_state"), overwrite=True if given("overwrite") else None,
                      fsync=False if given("no_fsync") else None, hash_sources=bool(given("hash_sources")),
                      progress=False if given("no_progress") else None, workers=given("workers"),
                      jobs=given("jobs"), executor=given("executor"), ray_address=given("ray_address"),
                      reader_limits=getattr(args, "reader_limits", DEFAULT_LIMITS), report=given("report"))


def run(args: argparse.Namespace) -> int:
    """One recipe: `migrator.run.recipe.run_recipe`, its outcome printed; several, or one over
    `--each` sources: `run_many`."""
    from ..run.jobs import is_many

    if is_many(args.recipes, args.each or ()):
        return run_many(args)
    from ..run.recipe import run_recipe

    outcome = run_recipe(args.recipes[0], options_of(args))
    print_run(outcome, as_json=args.json)
    if args.json:
        from ..core.display import print_json
        print_json(outcome.document)
    return outcome.code


def print_run(outcome: RunOutcome, *, as_json: bool, out: TextIO | None = None, err: TextIO | None = None) -> None:
    """One recipe's outcome as `migrate run` prints it (`--json`: the lines to stderr only; the
    document is the caller's to print)."""
    out, err = out or sys.stdout, err or sys.stderr
    if outcome.error is not None:
        if not as_json:
            what = "invalid recipe:\n" if outcome.invalid else "error: "
            print(f"migrate: {what}{escape(outcome.error, keep_newlines=True)}", file=err)
        return
    if outcome.planned is None:
        return
    if not as_json and outcome.failure is None:
        print_outcome(outcome.planned.display(), outcome.notes, outcome.unlisted, out=out, err=err)
    if outcome.failure is not None:
        print(f"migrate: error: {clip_words(escape(outcome.failure, keep_newlines=True))}", file=err)
    written = outcome.written
    if outcome.report_error is not None:
        done = f"wrote {written.target}, but " if written else ""
        print(f"migrate: error: {done}the report was not written: {outcome.report_error}", file=err)
        return
    if written is None:
        print(f"migrate: nothing written to {escape(outcome.target)}", file=err)
        return
    if not as_json:
        also = "" if written.record is None else f", and Burn's optimizer record {escape(written.record)}"
        print(f"wrote {escape(written.target)} ({outcome.target_format}): {count(written.tensors, 'tensor')}, "
              f"{human_bytes(written.nbytes)}{also}", file=out)


def print_outcome(summary: str, notes: Iterable[str], unlisted: Iterable[str], *, out: TextIO | None = None,
                  err: TextIO | None = None) -> None:
    """A plan's summary (it escapes the names it shows), its notes, and its problems the summary does
    not list."""
    out, err = out or sys.stdout, err or sys.stderr
    print(summary, file=out)
    for note in notes:
        print(f"note: {escape(note, keep_newlines=True)}", file=out)
    for problem in unlisted:
        print(f"error: {escape(problem, keep_newlines=True)}", file=err)


def print_plan_outcome(p: Plan) -> None:
    shown = {str(e) for e in p.report.displayed_errors()}  # listed in the summary
    print_outcome(p.report.display(), p.notes, [f for f in p.fatal if f not in shown])


def run_many(args: argparse.Namespace) -> int:
    """`migrate run` of several jobs (`migrator.run.jobs`): each job's outcome printed as it ends, with
    a heading line (one after the other: the heading first, a progress bar on a terminal), then the
    count; `--json` and `--report`: one document with every job."""
    from ..core.cpus import available_cpus
    from ..run import jobs as many

    options = options_of(args)
    try:
        specs = many.prepare(args.recipes, options, args.each or ())
        executor, address = many.jobs_executor(options, specs)
    except MigratorError as e:
        if args.json:
            from ..core.display import print_json
            print_json({"error": error_json(e)})
        else:
            print(f"migrate run: {escape(e, keep_newlines=True)}", file=sys.stderr)
        return EXIT_USAGE
    n = len(specs)
    jobs = options.jobs or available_cpus()
    # one job runs here; several each in a worker process, one at a time included: a job the
    # out-of-memory killer ends must not end the others with it
    serial = executor != "ray" and (jobs == 1 or n == 1)
    if executor == "ray":
        stream: Iterator[JobResult] = many.run_ray_jobs(specs, address)
    elif n == 1:
        stream = _serial(specs, args)
    elif serial:  # one at a time: the heading first, a progress bar on a terminal
        stream = many.run_local(specs, 1, progress=False if args.no_progress or args.json else None,
                                started=None if args.json else lambda spec: _heading(spec, n))
    else:
        stream = many.run_local(specs, min(jobs, n))
    results: dict[int, JobResult] = {}
    for result in stream:
        results[result.index] = result
        _print_job(result, specs[result.index], n, heading=not serial, as_json=args.json)
    ordered = [results[i] for i in range(n)]
    worst = max((r.code for r in ordered), default=EXIT_OK)
    if args.json:
        from ..core.display import print_json
        print_json(many.jobs_document(specs, ordered, worst))
    else:
        ok = sum(r.code == EXIT_OK for r in ordered)
        sys.stdout.write(f"{n} jobs: {ok} ok, {n - ok} failed\n")
    if args.report:
        from ..core.display import json_text
        from ..storage.atomic import write_file

        doc = many.jobs_report(specs, ordered, worst)
        try:
            write_file(args.report, (json_text(doc) + "\n").encode(), overwrite=bool(args.overwrite),
                       fsync=not args.no_fsync, make_folders=True)
        except MigratorError as e:
            print(f"migrate: error: the report was not written: {escape(e)}", file=sys.stderr)
            return max(worst, EXIT_MIGRATION)
    return worst


def _serial(specs: list[dict[str, Any]], args: argparse.Namespace) -> Iterator[JobResult]:
    """The one job of a `--each` matching one source, in this process, its heading printed before it
    runs (a progress bar where there is a terminal)."""
    from ..run.jobs import run_job

    for spec in specs:
        if not args.json:
            _heading(spec, len(specs))
        yield run_job(spec, progress=False if args.no_progress or args.json else None)


def _heading(spec: dict[str, Any], n: int) -> None:
    from ..run.jobs import describe_job

    sys.stdout.write(f"[{spec['index'] + 1}/{n}] {escape(describe_job(spec))}\n")
    sys.stdout.flush()


def _print_job(result: JobResult, spec: dict[str, Any], n: int, *, heading: bool, as_json: bool) -> None:
    """A job's output, whole: its heading (when not printed before it ran) and what `migrate run` of
    its recipe prints; a job that did not finish, its error."""
    import io

    from ..run.jobs import describe_job

    out, err = io.StringIO(), io.StringIO()
    if result.outcome is not None:
        print_run(result.outcome, as_json=as_json, out=out, err=err)
    elif result.lost is not None and result.lost["kind"] == "InternalError":
        print(f"migrate: internal error: {escape(result.lost['message'])}", file=err)
    elif result.lost is not None:
        err.write(f"migrate: error: {result.lost['message']}\n")
    if not as_json:
        if heading:
            status = "ok" if result.code == EXIT_OK else f"failed (exit {result.code})"
            # the job's own number (input order): jobs end in any order, a number names one job
            sys.stdout.write(f"[{result.index + 1}/{n}] {escape(describe_job(spec))}: {status}\n")
        sys.stdout.write(out.getvalue())
        sys.stdout.flush()
    sys.stderr.write(err.getvalue())
    sys.stderr.flush()


def plan(args: argparse.Namespace) -> int:
    from ..plan.document import plan_json
    from ..plan.loaded import load, open_plan
    from ..recipe.loader import RecipeError

    options = options_of(args)
    try:
        loaded = load(args.recipe, options.overrides())
    except RecipeError as e:
        return _recipe_error(e, args)
    with open_plan(loaded, **options.plan_settings(), shown=args.recipe) as p:
        add_target_problems(p)
        doc = plan_json(p) if args.json or args.html else None
        if args.html:  # the page instead of the table; the summary is still printed
            _write_plan_page(Path(args.html), p, doc)
        if doc is not None and args.json:
            from ..core.display import print_json
            print_json(doc)
        else:
            if not args.html:  # the page has the table and the op nodes
                _print_plan_table(p)
                _print_op_nodes(p)
            print_plan_outcome(p)
            if args.html:
                print(f"wrote {escape(args.html)}")
        return EXIT_OK if p.ok else EXIT_MIGRATION


def _write_plan_page(path: Path, p: Plan, doc: dict[str, Any] | None) -> None:
    """`plan --html`: written as a run's `--report` is (never over a file the plan reads or the
    target, never over an existing file without overwrite)."""
    from ..analysis.html_report import plan_page
    from ..plan.document import plan_json
    from ..run.execute import read_by
    from ..storage.atomic import write_file

    # as private as the files it describes, as a run's --report is
    write_file(path, plan_page(doc if doc is not None else plan_json(p)), overwrite=p.overwrite,
               protect=read_by(p), outputs=[p.target_path], fsync=p.fsync, make_folders=True,
               mode_from=p.source_modes())


def add_target_problems(p: Plan) -> None:
    """What a run would refuse about the target (it exists without overwrite, it is a folder or a
    special file, its folder is not writable): a problem of the plan, seen before any run."""
    from ..run.execute import plan_target_problems

    p.fatal.extend(plan_target_problems(p))


def _print_plan_table(p: Plan) -> None:
    union = p.union
    read = " + ".join(label for label, _ in p.inputs) if union is not None else p.source_path
    title = f"{read} ({p.source_format}) -> {p.target_path} ({p.target_format})"
    header: tuple[str, ...] = ("source", "target", "module", "ops", "before", "after", "size")
    # Most tensors share a few dtype/shape/module/ops/size texts: memoised, by identity where the
    # object is shared (a DType hashes slowly); the plan keeps every keyed object alive meanwhile.
    shapes: dict[tuple[int, tuple[int, ...]], str] = {}
    modules: dict[int, str] = {}
    ops_texts: dict[int, str] = {}
    sizes: dict[int, str] = {}
    rows: list[tuple[str, ...]] = []
    for e in p.entries:
        m, src, t, ops = e.module, e.source_tensor, e.tensor, e.ops
        module = ""
        if m is not None:
            module = modules.get(id(m)) or modules.setdefault(id(m), f"{m.name or '?'} ({m.how})")
        before = ""
        if src is not None:
            key = (id(src.dtype), src.shape)
            before = shapes.get(key) or shapes.setdefault(key, f"{src.dtype.display} {list(src.shape)}")
        key = (id(t.dtype), t.shape)
        after = shapes.get(key) or shapes.setdefault(key, f"{t.dtype.display} {list(t.shape)}")
        ops_text = ops_texts.get(id(ops))
        if ops_text is None:
            ops_text = ops_texts[id(ops)] = "; ".join(map(_short_op, ops)) if ops else ""
        nbytes = t.nbytes
        size = sizes.get(nbytes) or sizes.setdefault(nbytes, human_bytes(nbytes))
        rows.append((e.source or "-", e.target, module, ops_text, before, after, size))
    if union is not None:  # several sources: which one, and the tensor's own name there
        header = ("from", *header)
        rows = [(union.label_of(row[0]) or "-", union.origin_of[row[0]].tensor if row[0] in union.origin_of
                 else row[0], *row[1:]) for row in rows]
    # Every column but the size wraps (names at dots, the rest at spaces) to fit the terminal;
    # every cell is shown literally (display.escape).
    last = len(header) - 1
    print_table(title, header, rows, right=(last,), wrap_cols=tuple(range(last)),
                rich=len(rows) <= RICH_TABLE_ROWS and sys.stdout.isatty())


def _print_op_nodes(p: Plan) -> None:
    """Every op node of the recipe's `ops:` (the summary lists the first 10): what it read, what it made."""
    nodes = p.report.ops
    if not nodes:
        return
    rows = [(f"{n['op']} ops[{n['index']}]", n["at"], ", ".join(n["inputs"]), ", ".join(n["outputs"])) for n in nodes]
    print_table(f"op nodes ({len(rows)})", ("op", "recipe", "inputs", "outputs"), rows, right=(), wrap_cols=(1, 2, 3),
                rich=len(rows) <= RICH_TABLE_ROWS and sys.stdout.isatty())


_RENAMES = ("remap ", "index ")


def _short_op(op: str) -> str:
    """Renames are visible in the source/target columns: the table keeps only their kind."""
    return op[:5] if op.startswith(_RENAMES) else op


def validate(args: argparse.Namespace) -> int:
    """Each recipe: ok, invalid (exit 2) or would fail (exit 1); the exit code is the worst.
    With `--json`, one document: {"ok": bool, "exit_code": N, "recipes": [one result per recipe]}."""
    results = [_validate_one(path, args) for path in args.recipes]
    worst = max(r["exit_code"] for r in results)
    if getattr(args, "json", False):
        from ..core.display import print_json
        print_json({"ok": worst == EXIT_OK, "exit_code": worst, "recipes": results})
        return worst
    for r in results:
        shown = escape(r["recipe"])
        if r["status"] == "ok":
            print(f"{shown}: ok ({count(r['tensors'], 'tensor')} -> {escape(r['target'])})")
        elif r["status"] == "invalid":
            print(f"{shown}: invalid\n{escape(r['error']['message'], keep_newlines=True)}", file=sys.stderr)
        elif r["status"] == "would_fail":
            print(f"{shown}: sources parse, but the run would fail:", file=sys.stderr)
            for problem in r["errors"]:
                print(f"  {escape(problem, keep_newlines=True)}", file=sys.stderr)
        else:
            print(f"{shown}: {escape(r['error']['message'], keep_newlines=True)}", file=sys.stderr)
    return worst


def _validate_one(path: str, args: argparse.Namespace) -> dict[str, Any]:
    from ..plan.loaded import load, open_plan
    from ..recipe.loader import RecipeError

    result: dict[str, Any] = {"recipe": path}
    options = options_of(args)
    try:
        loaded = load(path, options.overrides())
    except RecipeError as e:
        return {**result, "status": "invalid", "exit_code": EXIT_USAGE, "error": error_json(e)}
    try:
        with open_plan(loaded, **options.plan_settings(), shown=path) as p:
            add_target_problems(p)
            result.update(tensors=len(p.entries), target=str(p.target_path))
            if p.fatal:
                return {**result, "status": "would_fail", "exit_code": EXIT_MIGRATION, "errors": list(p.fatal)}
            return {**result, "status": "ok", "exit_code": EXIT_OK}
    except RecipeError as e:  # an op that does not fit the source's shapes: the recipe is wrong
        return {**result, "status": "invalid", "exit_code": EXIT_USAGE, "error": error_json(e)}
    except MigratorError as e:
        return {**result, "status": "error", "exit_code": EXIT_MIGRATION, "error": error_json(e)}


def schema(args: argparse.Namespace) -> int:
    from ..recipe.loader import recipe_json_schema_text

    text = recipe_json_schema_text()
    if getattr(args, "output", None):
        from ..storage.atomic import write_file

        write_file(args.output, text.encode(), overwrite=args.overwrite, make_folders=True)
        print(f"wrote {args.output}")
        return EXIT_OK
    sys.stdout.write(text)
    return EXIT_OK

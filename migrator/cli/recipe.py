"""`migrate run | plan | validate | schema`: recipes from the command line.

Exit codes: 0 success, 1 migration errors (missing tensors, shape mismatches, unreadable files),
2 invalid recipe or usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.display import RICH_TABLE_ROWS, count, escape, human_bytes, print_table
from ..core.errors import EXIT_MIGRATION, EXIT_OK, EXIT_USAGE, MigratorError, error_json
from .options import LIMIT_HELP, NO_FSYNC_HELP, command, positive

if TYPE_CHECKING:  # the plan and the run are imported by the commands, not by `migrate --help`
    from ..plan.build import Plan


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
    run.add_argument("--source", metavar="PATH", help="read PATH instead of the recipe's source.path "
                    "(relative to the current folder)")
    run.add_argument("--target", metavar="PATH", help="write PATH instead of the recipe's target.path "
                    "(relative to the current folder); with --each, a pattern with placeholders")
    run.add_argument("--each", nargs="+", metavar="GLOB", help="run the one recipe once per matching source "
                     "(quoted globs, ** recursive, or paths), writing --target with its placeholders filled in")
    run.add_argument("--jobs", type=positive, metavar="N", help="jobs run at once, each in its own process "
                     "(default: the CPUs available; 1: one after the other); with one job: --workers")
    run.add_argument("--workers", type=positive, metavar="W", help="write one job's output with W workers: "
                     "disjoint ranges of one .bpk/.safetensors file, or whole shards of a folder (default 1)")
    run.add_argument("--executor", choices=("local", "ray"), default=None,
                     help="where jobs and write tasks run: here (default), or as Ray tasks (pip install "
                     "'migrator[ray]'; paths must be on storage every node sees); wins over the recipe's executor:")
    run.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster to join (default: $RAY_ADDRESS, "
                     "else a local Ray started for the run)")
    run.add_argument("--limit", dest="limits", action="append", default=[], metavar="NAME=VALUE", help=LIMIT_HELP)
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
    plan.add_argument("--source", metavar="PATH", help="read PATH instead of the recipe's source.path "
                    "(relative to the current folder)")
    plan.add_argument("--target", metavar="PATH", help="write PATH instead of the recipe's target.path "
                    "(relative to the current folder)")
    plan.add_argument("--limit", dest="limits", action="append", default=[], metavar="NAME=VALUE", help=LIMIT_HELP)
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
    val.add_argument("--source", metavar="PATH", help="(one recipe only) read PATH instead of "
                    "the recipe's source.path (relative to the current folder)")
    val.add_argument("--target", metavar="PATH", help="(one recipe only) write PATH instead of "
                    "the recipe's target.path (relative to the current folder)")
    val.add_argument("--limit", dest="limits", action="append", default=[], metavar="NAME=VALUE", help=LIMIT_HELP)
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


def run(args: argparse.Namespace) -> int:
    """One recipe as before; several, or one over `--each` sources: `migrator.run.jobs`."""
    from ..run.job_spec import is_many
    from ..run.jobs import run_many

    if is_many(args):
        return run_many(args)
    from ..run.recipe import RunOptions, run_one_recipe

    outcome = run_one_recipe(args.recipes[0], RunOptions.of(args), Path(args.report) if args.report else None)
    if args.json:
        from ..core.display import print_json
        print_json(outcome.document)
    return outcome.code


def plan(args: argparse.Namespace) -> int:
    from ..plan.document import plan_json
    from ..plan.loaded import load, open_plan
    from ..recipe.loader import RecipeError
    from ..run import recipe as engine

    try:
        loaded = load(args.recipe, args)
    except RecipeError as e:
        return _recipe_error(e, args)
    with open_plan(loaded, args) as p:
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
            engine.print_outcome(p)
            if args.html:
                print(f"wrote {escape(args.html)}")
        return EXIT_OK if p.ok else EXIT_MIGRATION


def _write_plan_page(path: Path, p: Plan, doc: dict[str, Any] | None) -> None:
    """`plan --html`: written as a run's `--report` is (never over a file the plan reads or the
    target, never over an existing file without overwrite)."""
    from ..analysis.html_report import plan_page
    from ..plan.document import plan_json
    from ..run.execute import read_by, source_modes
    from ..storage.atomic import write_file

    # as private as the files it describes, as a run's --report is
    write_file(path, plan_page(doc if doc is not None else plan_json(p)), overwrite=p.overwrite,
               protect=read_by(p), outputs=[p.target_path], fsync=p.fsync, make_folders=True,
               mode_from=source_modes(p))


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
    try:
        loaded = load(path, args)
    except RecipeError as e:
        return {**result, "status": "invalid", "exit_code": EXIT_USAGE, "error": error_json(e)}
    try:
        with open_plan(loaded, args, path) as p:
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

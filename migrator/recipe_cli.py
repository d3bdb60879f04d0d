"""`migrate run | plan | validate | schema`: recipes from the command line.

Exit codes: 0 success, 1 migration errors (missing tensors, shape mismatches, unreadable files),
2 invalid recipe or usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .display import RICH_TABLE_ROWS, count, escape, human_bytes, print_table
from .errors import MigratorError, error_json
from .limits import DEFAULT_LIMITS
from .plan import Plan, SourceKeyError, build_plan

EXIT_OK, EXIT_MIGRATION, EXIT_USAGE = 0, 1, 2


def _load(path: str, args: argparse.Namespace | None = None) -> Any:
    """The recipe, with the command line's `--source` / `--target` (if any) in place of its paths."""
    from .recipe_loader import load_recipe

    loaded = load_recipe(path)
    overrides = _overrides(args)
    return _with_paths(loaded, overrides) if overrides else loaded


def _overrides(args: argparse.Namespace | None) -> dict[str, str]:
    """{"source": PATH, "target": PATH} as given on the command line (either may be absent)."""
    return {k: v for k in ("source", "target") if (v := getattr(args, k, None))}


def _with_paths(loaded: Any, overrides: dict[str, str]) -> Any:
    """`loaded` reading/writing the given paths instead of its own.

    Command-line paths are taken from the current folder (as every shell path is), not from the
    recipe's: they are made absolute here, so the recipe's folder no longer applies to them. The
    loader's "target is the source" check is repeated for the new pair: the run would destroy its input.
    """
    import dataclasses
    import os

    from .recipe_loader import RecipeError, RecipeIssue, _read_candidates, _same_file, _written_candidates

    recipe = loaded.recipe
    if "source" in overrides and recipe.sources is not None:
        from .sources import override_source

        recipe = override_source(recipe, overrides.pop("source"), str(loaded.path))
    from .remote import as_path, is_url, local_of

    absolute = {k: as_path(v) if is_url(v) else Path(os.path.abspath(os.path.expanduser(local_of(v))))
                for k, v in overrides.items()}
    if "source" in absolute:
        assert recipe.source is not None
        recipe = recipe.model_copy(update={"source": recipe.source.model_copy(update={"path": absolute["source"]})})
    if "target" in absolute:
        recipe = recipe.model_copy(update={"target": recipe.target.model_copy(update={"path": absolute["target"]})})
    out = dataclasses.replace(loaded, recipe=recipe)
    reads = out.source_paths + ([out.template_path] if out.template_path is not None else [])
    written = _written_candidates(out.target_path, recipe.target.format)
    if any(_same_file(w, c) for w in written for r in reads for c in _read_candidates(r)):
        raise RecipeError([RecipeIssue(str(loaded.path), 0, 0, "--target",
                                       f"the target {out.target_path} is the same file as the source or template",
                                       "write the output to a new file")])
    return out


@contextmanager
def _plan_for(loaded: Any, args: argparse.Namespace, shown: str | None = None) -> Iterator[Plan]:
    """The recipe's plan, open for the block, read within the command line's `--limit` settings."""
    try:
        plan = build_plan(loaded.recipe, loaded.base_dir, recipe_sha256=loaded.sha256,
                          hash_sources=getattr(args, "hash_sources", False),
                          overwrite=True if getattr(args, "overwrite", False) else None,
                          fsync=False if getattr(args, "no_fsync", False) else None,
                          module_origins=loaded.module_origins, op_origins=loaded.op_origins,
                          limits=getattr(args, "reader_limits", DEFAULT_LIMITS),
                          source_origins=loaded.source_origins)
    except SourceKeyError as e:  # about one recipe value: name its line
        from .recipe_loader import locate

        given = shown or getattr(args, "recipe", None)  # the recipe's path as given
        where = locate(loaded, e.loc, given if isinstance(given, str) else None)
        if where is None:
            raise
        located = SourceKeyError(f"{where}: {_loc_text(e.loc)}: {e}")
        located.file = e.file  # the source file, for --json; the text leads with the recipe line
        raise located from None
    with plan:
        yield plan


def _loc_text(loc: tuple[str | int, ...]) -> str:
    """('sources', 1, 'top_level_key') as the recipe spells it: sources[1].top_level_key."""
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(loc))


def _recipe_error(e: Exception, args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        from .display import print_json
        print_json({"error": error_json(e)})
    else:
        print(f"migrate: invalid recipe:\n{escape(e, keep_newlines=True)}", file=sys.stderr)
    return EXIT_USAGE


def _print_outcome(plan: Plan) -> None:
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
    if overrides:
        doc["source"] = str(plan.source_path)
        doc["overrides"] = dict(overrides)
    return doc


def _write_report(path: Path, plan: Plan, doc: dict[str, Any]) -> None:
    """Written through the same atomic path as the output, after it: never onto a file the run
    read or wrote, never over an existing file without overwrite."""
    from .atomic import write_file
    from .display import json_text
    from .execute import read_by, source_modes
    from .html_report import is_html_path, plan_page

    data = plan_page(plan_json(plan), doc) if is_html_path(path) else (json_text(doc) + "\n").encode()
    write_file(path, data, overwrite=plan.overwrite, protect=read_by(plan),
               outputs=[plan.target_path], fsync=plan.fsync, mode_from=source_modes(plan), make_folders=True)


def run(args: argparse.Namespace) -> int:
    """One recipe as before; several, or one over `--each` sources: `migrator.jobs`."""
    from .jobs import is_many, run_many

    if is_many(args):
        return run_many(args)
    outcome = run_one_recipe(args.recipes[0], args, Path(args.report) if args.report else None)
    if args.json:
        from .display import print_json
        print_json(outcome.document)
    return outcome.code


@dataclass
class RunOutcome:
    """One recipe's run: its exit code, its `run --json` document and its `--report` document (None
    when the recipe did not load)."""

    code: int
    document: dict[str, Any]
    report: dict[str, Any] | None = None


def run_one_recipe(path: str, args: argparse.Namespace, report_path: Path | None = None,
               runner: Any = None) -> RunOutcome:
    """Run one recipe, printing its text output (none under `--json`: the caller prints `document`);
    with `report_path`, write its report there. `runner`: the workers that write the output
    (`migrator.parallel_write`; None: this thread). A MigratorError while planning propagates."""
    from .atomic import check_target
    from .execute import check_plan_target, read_by, run_plan
    from .recipe_loader import RecipeError

    try:
        loaded = _load(path, args)
    except RecipeError as e:
        if not args.json:
            print(f"migrate: invalid recipe:\n{escape(e, keep_newlines=True)}", file=sys.stderr)
        return RunOutcome(EXIT_USAGE, {"error": error_json(e)})
    with _plan_for(loaded, args) as plan:
        # Everything the writes would refuse is refused before anything is written.
        outputs = [report_path] if report_path else []
        check_plan_target(plan)
        if report_path:  # not a file the run reads, not the target (by path or inode), not over a file
            check_target(report_path, overwrite=plan.overwrite, protect=read_by(plan), outputs=[plan.target_path])
            if getattr(plan.writer, "sharded", False):  # nor inside the output folder
                from .atomic_folder import check_folder_distinct

                check_folder_distinct(plan.target_path, outputs=outputs)
        result = None
        failure: str | None = None
        if plan.ok:
            if runner is None:
                from .jobs import runner_for

                runner = runner_for(args, plan, loaded)
            try:
                result = run_plan(plan, progress=False if args.no_progress or runner is not None else None,
                                  outputs=outputs, runner=runner)
            except MigratorError as e:  # the write failed (disk full, source truncated...): nothing published
                failure = str(e)
        # The summary comes after the output is published, never before; a failed write has none
        # (it would list as applied what was not written): its error follows.
        errors = plan.fatal + ([failure] if failure else [])
        error = _plan_error(plan) or ({"error": {"kind": "OutputError", "message": failure,
                                                 "file": str(plan.target_path), "tensor": None}}
                                      if failure else {})
        document = {"report": report_document(plan, failure, result.target if result else None),
                    "errors": errors, "notes": plan.notes, **error}
        report = report_document(plan, failure, result.target if result else None, _overrides(args))
        outcome = RunOutcome(EXIT_OK if result is not None else EXIT_MIGRATION, document, report)
        if not args.json and failure is None:
            _print_outcome(plan)
        if failure:
            print(f"migrate: error: {escape(failure, keep_newlines=True)}", file=sys.stderr)
        if report_path:
            try:
                _write_report(report_path, plan, report)
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


def plan(args: argparse.Namespace) -> int:
    from .recipe_loader import RecipeError

    try:
        loaded = _load(args.recipe, args)
    except RecipeError as e:
        return _recipe_error(e, args)
    with _plan_for(loaded, args) as p:
        _add_target_problems(p)
        doc = plan_json(p) if args.json or args.html else None
        if args.html:  # the page instead of the table; the summary is still printed
            _write_plan_page(Path(args.html), p, doc)
        if doc is not None and args.json:
            from .display import print_json
            print_json(doc)
        else:
            if not args.html:  # the page has the table and the op nodes
                _print_plan_table(p)
                _print_op_nodes(p)
            _print_outcome(p)
            if args.html:
                print(f"wrote {escape(args.html)}")
        return EXIT_OK if p.ok else EXIT_MIGRATION


def _write_plan_page(path: Path, p: Plan, doc: dict[str, Any] | None) -> None:
    """`plan --html`: written as a run's `--report` is (never over a file the plan reads or the
    target, never over an existing file without overwrite)."""
    from .atomic import write_file
    from .execute import read_by
    from .html_report import plan_page

    write_file(path, plan_page(doc if doc is not None else plan_json(p)), overwrite=p.overwrite,
               protect=read_by(p), outputs=[p.target_path], fsync=p.fsync, make_folders=True)


def _add_target_problems(p: Plan) -> None:
    """What a run would refuse about the target (it exists without overwrite, it is a folder or a
    special file, its folder is not writable): a problem of the plan, seen before any run."""
    from .execute import plan_target_problems

    p.fatal.extend(plan_target_problems(p))


def plan_json(p: Plan) -> dict[str, Any]:
    """With several sources, each entry has `from` (its source's name) and `from_tensor` (the tensor's
    name in that source), and `sources` lists them."""
    entries = []
    union = p.union
    for e in p.entries:
        origin = union.origin_of.get(e.source) if union is not None and e.source is not None else None
        entries.append({**({} if union is None or origin is None else {"from": union.parts[origin.part].label,
                                                                        "from_tensor": origin.tensor}),
            "source": e.source, "target": e.target, "ops": e.ops,
            "before": None if e.before is None else {"dtype": e.before[0].display, "shape": list(e.before[1])},
            "after": {"dtype": e.tensor.dtype.display, "shape": list(e.tensor.shape)},
            "nbytes": e.tensor.nbytes,
            "module": None if e.module is None else {"type": e.module.name, "how": e.module.how,
                                                     "reason": e.module.reason},
            "kept_from_template": e.kept_from_template,
        })
    return {"source": str(p.source_path), "source_format": p.source_format, "target": str(p.target_path),
            "target_format": p.target_format, "template": None if p.template_path is None else str(p.template_path),
            "entries": entries, "metadata": p.metadata, "scalars": {k: v.to_json() for k, v in p.scalars.items()},
            "report": p.report.to_json(), "errors": p.fatal, "notes": p.notes, **_plan_error(p),
            **({"sources": [{"name": label, "path": str(path)} for label, path in p.inputs]} if union else {})}


def _plan_error(p: Plan) -> dict[str, Any]:
    """`{"error": ...}` when the plan cannot run (as every failing `--json` command prints), else {}."""
    if not p.fatal:
        return {}
    return {"error": {"kind": "MigrationError", "message": "migration not written:\n  " + "\n  ".join(p.fatal),
                      "file": str(p.target_path), "tensor": None}}


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
        from .display import print_json
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
    from .recipe_loader import RecipeError

    result: dict[str, Any] = {"recipe": path}
    try:
        loaded = _load(path, args)
    except RecipeError as e:
        return {**result, "status": "invalid", "exit_code": EXIT_USAGE, "error": error_json(e)}
    try:
        with _plan_for(loaded, args, path) as p:
            _add_target_problems(p)
            result.update(tensors=len(p.entries), target=str(p.target_path))
            if p.fatal:
                return {**result, "status": "would_fail", "exit_code": EXIT_MIGRATION, "errors": list(p.fatal)}
            return {**result, "status": "ok", "exit_code": EXIT_OK}
    except RecipeError as e:  # an op that does not fit the source's shapes: the recipe is wrong
        return {**result, "status": "invalid", "exit_code": EXIT_USAGE, "error": error_json(e)}
    except MigratorError as e:
        return {**result, "status": "error", "exit_code": EXIT_MIGRATION, "error": error_json(e)}


def schema(args: argparse.Namespace) -> int:
    from .recipe_loader import recipe_json_schema_text

    text = recipe_json_schema_text()
    if getattr(args, "output", None):
        from .atomic import write_file

        write_file(args.output, text.encode(), overwrite=args.overwrite, make_folders=True)
        print(f"wrote {args.output}")
        return EXIT_OK
    sys.stdout.write(text)
    return EXIT_OK

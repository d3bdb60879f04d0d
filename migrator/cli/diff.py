"""`migrate diff A B` on the command line: arguments, the text table, exit codes.

Exit 0 when every tensor is identical (or close, with a tolerance), 1 when anything differs or
is missing on one side (or the recipe's plan could not have made B), 2 for usage errors.
Imported by `migrate --help`: only argparse at module level.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from ..core.errors import EXIT_MIGRATION, EXIT_OK, EXIT_USAGE

EXIT_DIFFERENT = EXIT_MIGRATION  # diff's 1: something differs or is missing
_NAMES = {"only_in_a": "only in A", "only_in_b": "only in B", "shape_mismatch": "shape mismatch",
          "dtype_mismatch": "dtype mismatch"}


def add_parser(sub: Any, command: Callable[..., argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = command(sub, "diff", "compare two checkpoints tensor by tensor (streamed)",
                "Compare A and B tensor by tensor, streamed in windows: names matched directly, through "
                "a recipe\n(A = its source, B = its output, compared after the plan's renames, layout ops "
                "and casts), or\nthrough convert's options. Exact (bit-identical) unless --atol/--rtol. "
                "Exit 0 all matched,\n1 anything differs, 2 usage error.",
                "  migrate diff model.safetensors model.bpk\n"
                "  migrate diff tiny-bert.pt tiny-bert.bpk --recipe recipes/bert-to-burn.yaml --json\n"
                "  migrate diff a.pt b.bpk --adapter pytorch_to_burn --dtype F16\n"
                "  migrate diff a.safetensors b-f16.safetensors --atol 1e-3 --rtol 1e-3")
    p.add_argument("a", help="the first checkpoint (file, model folder, index or quoted glob); a recipe's source")
    p.add_argument("b", help="the second checkpoint; a recipe's output")
    p.add_argument("--recipe", metavar="RECIPE.yaml", help="compare B with what the recipe makes of A")
    p.add_argument("--atol", type=float, metavar="X", help="tolerance mode: |a-b| <= atol + rtol*|b| (default 0)")
    p.add_argument("--rtol", type=float, metavar="X", help="tolerance mode, relative part (default 0)")
    _add_convert_rows(p)
    p.add_argument("--window", default="4MiB", metavar="SIZE",
                   help="bytes read per tensor side at a time (default 4MiB; 4MB = 4*10^6)")
    p.add_argument("--all", action="store_true", help="list every tensor, not only those that differ")
    p.add_argument("--json", action="store_true", help="print the comparison (or the error) as JSON")
    p.add_argument("--html", metavar="FILE", help="also write the comparison as a self-contained HTML page")
    p.add_argument("--overwrite", action="store_true", help="replace an existing HTML page")
    return p


def _rows() -> tuple[Any, ...]:
    """convert's rows diff takes: A's options (`convert_options.DIFF`) and B's format (`--to`)."""
    import dataclasses

    from ..recipe.convert_options import DIFF, row, source_formats

    # B is read, as A is: any format migrator reads, not only those it writes
    return (*(row(name) for name in DIFF), dataclasses.replace(row("target_format_name"), choices=source_formats))


def _add_convert_rows(p: argparse.ArgumentParser) -> None:
    """convert's options, from its table, with A and B for SRC and DST; `--a-format`/`--b-format` are
    the old spellings of `--from`/`--to`."""
    from ..recipe.convert_options import ConvertOptions
    from .options import add_rows

    group = p.add_argument_group("convert's options", "A is read and changed as `migrate convert A B` would "
                                 "read and change it, then compared with B")
    add_rows(p, _rows(), ConvertOptions(), groups={r.group: group for r in _rows()},
             old={"source_format": ("--a-format",), "target_format_name": ("--b-format",)},
             text=_for_a_and_b)


def _for_a_and_b(help: str) -> str:
    """convert's help of an option as diff's: A is SRC, B is DST, and B is read, so its format is detected
    as A's is."""
    return help.replace("from DST's extension", "detected from its bytes").replace("SRC", "A").replace("DST", "B")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..files.shard_layout import parse_size
    from ..recipe.convert_options import ConvertOptions
    from .options import check_remap_options, rows_given

    given = ConvertOptions(**rows_given(args, _rows(), parser))
    check_remap_options(list(given.remaps), parser)
    read_as: dict[str, Any] = {"source_format": given.source_format, "top_level_key": given.top_level_key}
    options = {name: getattr(given, name) for name in _plan_options()}
    if args.recipe and any(v not in (None, ()) for v in options.values()):
        parser.error("--recipe and convert's options (--remap, --adapter, --dtype, ...) do not combine: "
                     "put the options into the recipe")
    try:
        window = parse_size(args.window)
    except ValueError as e:
        parser.error(f"--window: {e}".replace("a shard size", "a window"))
    from ..analysis.diff import DiffOptions, diff_document, tolerance

    try:
        tolerance(args.atol, args.rtol)
    except ValueError as e:
        parser.error(str(e))
    from ..recipe.convert import ConvertUsageError

    try:
        compare_as = DiffOptions(recipe=args.recipe, atol=args.atol, rtol=args.rtol, b_format=given.target_format_name,
                                 window=window, convert={**read_as, **options})
        doc = diff_document(args.a, args.b, compare_as, planner=_planner(args) if args.recipe else None)
    except ConvertUsageError as e:
        from ..core.display import escape
        from .output import print_json_error

        if args.json:
            print_json_error({"kind": "UsageError", "message": str(e)})
        else:
            print(f"migrate diff: {escape(e, keep_newlines=True)}", file=sys.stderr)
        return EXIT_USAGE
    if args.html:  # never over A, B or the recipe; no more readable than they are (as every report)
        from ..analysis.html_report import diff_page, write_page
        from ..storage.remote import is_url

        local = [p for p in (args.a, args.b) if not is_url(p) and os.path.exists(p)]
        write_page(args.html, diff_page(doc), overwrite=args.overwrite,
                   protect=[args.a, args.b, *([args.recipe] if args.recipe else [])], make_folders=True,
                   mode_from=local)
    if args.json:
        from .output import write_inspect_json

        write_inspect_json(doc, sys.stdout)
    else:
        print_diff(doc, every=args.all)
    return EXIT_OK if doc["matched"] else EXIT_DIFFERENT


def _plan_options() -> tuple[str, ...]:
    """A's options that change it (through a one-off plan), not only how it is read."""
    from ..recipe.convert_options import DIFF

    return tuple(name for name in DIFF if name not in ("source_format", "top_level_key"))


def _planner(args: argparse.Namespace) -> Callable[[Callable[[Any], Any]], Any]:
    """The recipe's plan as `migrate run` builds it, reading A (`--source A`), compared and never
    written: the engine (`migrator.run.recipe.run_recipe`) with the comparison as its `use`."""
    def planner(use: Callable[[Any], Any]) -> Any:
        from ..run.recipe import RunOptions, run_recipe

        outcome = run_recipe(args.recipe, RunOptions(source=args.a, overwrite=True, compared=True), use=use)
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    return planner


def _number(x: float | None) -> str:
    return "-" if x is None else ("0" if x == 0 else f"{x:.3g}")


def print_diff(doc: dict[str, Any], *, every: bool = False) -> None:
    """The table of tensors that differ (every tensor with `every`), then the counts."""
    from ..core.display import count, escape, print_table

    tensors = doc["tensors"]
    shown = tensors if every else [t for t in tensors if t["status"] != "identical"]
    rows = []
    for t in shown:
        dtype = t["dtype_b"] or t["dtype_a"] or "-"
        if t["dtype_a"] and t["dtype_b"] and t["dtype_a"] != t["dtype_b"]:
            dtype = f"{t['dtype_a']} -> {t['dtype_b']}"
        sa, sb = t["shape_a"], t["shape_b"]
        shape = str(sb if sb is not None else sa) if sa is None or sb is None or sa == sb else f"{sa} -> {sb}"
        first = "-" if t["first_index"] is None else str(t["first_index"])
        differing = "-" if t["differing"] is None else f"{t['differing']:,}"
        name = t["name"]
        if t["a_name"] and t["a_name"] != name:
            name = f"{t['a_name']} -> {name}"
        rows.append((name, _NAMES.get(t["status"], t["status"]), dtype, shape, _number(t["max_abs_diff"]),
                     _number(t["max_rel_diff"]), differing, first))
    mode = "exact" if doc["mode"] == "exact" else f"atol {doc['atol']:g}, rtol {doc['rtol']:g}"
    title = f"{doc['a']} vs {doc['b']} ({mode}" + (f", through {doc['recipe']})" if doc["recipe"] else ")")
    if rows:
        print_table(title, ("tensor", "status", "dtype", "shape", "max abs", "max rel", "differing", "first index"),
                    rows, right=(4, 5, 6))
    else:
        print(escape(title))
    counts = ", ".join(f"{n:,} {_NAMES.get(k, k)}" for k, n in doc["summary"].items() if n)
    print(f"{count(len(tensors), 'tensor')}: {counts or 'none'}")
    if doc.get("hint"):
        print(f"hint: {escape(doc['hint'])}")
    for problem in doc.get("plan_errors") or ():
        print(f"error: the recipe's plan fails: {escape(problem, keep_newlines=True)}", file=sys.stderr)
    print("A and B match" if doc["matched"] else "A and B differ")

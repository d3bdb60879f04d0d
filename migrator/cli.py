"""The `migrate` command line. Imports stay inside commands so `migrate --help` starts fast."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

EXIT_OK, EXIT_MIGRATION, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer killed by it
NO_FSYNC_HELP = ("publish without flushing to disk first (faster, like cp): never partial after a crash of "
                 "migrator, but a power loss soon after may lose the new file")


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="migrate",
        description="Move neural-network weights between burnpack (.bpk), SafeTensors and PyTorch files.",
    )
    p.add_argument("--version", action="version", version=f"migrator {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ins = sub.add_parser("inspect", help="list the tensors, metadata and scalars of a file")
    ins.add_argument("file")
    ins.add_argument("--json", action="store_true", help="print a JSON object instead of tables")
    ins.add_argument("--format", default="auto", help="auto | burnpack | safetensors | pytorch")
    ins.add_argument("--top-level-key", help="PyTorch: the nested dict holding the tensors (dotted path)")
    ins.add_argument("--limit", type=int, default=None, help="show at most N tensors in the table")

    conv = sub.add_parser("convert", help="convert a file to another format (format from each path)")
    conv.add_argument("src")
    conv.add_argument("dst")
    conv.add_argument("--overwrite", action="store_true", help="replace an existing target")
    conv.add_argument("--no-fsync", action="store_true", help=NO_FSYNC_HELP)
    conv.add_argument("--from", dest="source_format", default="auto", help="source format (default: detect)")
    conv.add_argument("--to", dest="target_format", default="auto", help="target format (default: extension)")
    conv.add_argument("--top-level-key", help="the nested dict (PyTorch) or name prefix holding the tensors")
    conv.add_argument("--remap", action="append", default=[], metavar="REGEX=REPL", help="rename (repeatable, ordered)")
    conv.add_argument("--include", action="append", default=[], metavar="REGEX", help="keep only matching names")
    conv.add_argument("--exclude", action="append", default=[], metavar="REGEX", help="drop matching names")
    conv.add_argument("--adapter", action="append", default=[], metavar="NAME",
                      help="pytorch_to_burn | burn_to_pytorch | half_precision (repeatable, chained in order)")
    conv.add_argument("--dtype", metavar="DTYPE", help="cast every float tensor (e.g. F16, BF16)")
    conv.add_argument("--contiguous-indices", action="store_true", help="renumber index segments 0,1,2,...")
    conv.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                      help="add a metadata entry (repeatable)")
    conv.add_argument("--no-metadata", action="store_true", help="write no metadata except --metadata entries")
    conv.add_argument("--emit-recipe", action="store_true", help="print the equivalent recipe as YAML; write nothing")
    conv.add_argument("--json", action="store_true", help="print the result as JSON")
    conv.add_argument("--no-progress", action="store_true", help="no progress bar")

    run = sub.add_parser("run", help="run a recipe: plan, stream, write atomically, report")
    run.add_argument("recipe")
    run.add_argument("--report", metavar="FILE.json", help="also write the report as JSON")
    run.add_argument("--overwrite", action="store_true", help="replace an existing target")
    run.add_argument("--no-fsync", action="store_true", help=NO_FSYNC_HELP)
    run.add_argument("--hash-sources", action="store_true", help="record the sources' sha256 in the metadata")
    run.add_argument("--json", action="store_true", help="print the report as JSON")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    plan = sub.add_parser("plan", help="show what a recipe would do (names, ops, dtypes, shapes); write nothing")
    plan.add_argument("recipe")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")

    val = sub.add_parser("validate", help="validate recipes and check their sources parse (headers only)")
    val.add_argument("recipes", nargs="+")

    sub.add_parser("schema", help="print the recipe JSON Schema")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    import gc

    # A run makes a few objects per tensor that live until the end: with the default threshold
    # (700) the collector rescans them over and over, ~30% of a 100k-tensor conversion.
    gc.set_threshold(100_000, 50, 100)
    # numpy starts an OpenBLAS thread pool at import whose threads spin between calls; migrator
    # does no linear algebra, so one thread (none started) is enough. A user's setting wins.
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from .errors import MigratorError

    try:
        if args.command == "inspect":
            return _inspect(args)
        if args.command == "convert":
            return _convert(args, parser)
        if args.command in ("run", "plan", "validate", "schema"):
            from . import recipe_cli

            return int(getattr(recipe_cli, args.command)(args))
    except MigratorError as e:
        print(f"migrate: error: {e}", file=sys.stderr)
        return EXIT_MIGRATION
    except KeyboardInterrupt:
        print("migrate: interrupted; no output was published", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `migrate plan r.yaml | head`: the reader left; stop quietly, as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit-time flush must not fail too
        return EXIT_BROKEN_PIPE
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


def _reader_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"top_level_key": args.top_level_key} if args.top_level_key else {}


def _inspect(args: argparse.Namespace) -> int:
    from .inspect import inspect_file

    info = inspect_file(args.file, format=args.format, **_reader_options(args))
    if args.json:
        json.dump(info, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return EXIT_OK
    _print_inspect(info, args.limit)
    return EXIT_OK


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _print_inspect(info: dict[str, Any], limit: int | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    tensors = info["tensors"]
    with_ids = any("param_id" in t for t in tensors)
    table = Table(title=f"{info['path']} ({info['format']}, {_human(info['file_size'])})", title_justify="left")
    for col, just in (("name", "left"), ("dtype", "left"), ("shape", "left"), ("bytes", "right"),
                      ("offset", "right")):
        table.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    if with_ids:
        table.add_column("param_id", justify="right")
    shown = tensors if limit is None else tensors[:limit]
    for t in shown:
        row = [t["name"], t["dtype"], str(t["shape"]), f"{t['nbytes']:,}",
               "-" if t["offset"] is None else f"{t['offset']:,}"]
        if with_ids:
            row.append(str(t.get("param_id", "")))
        table.add_row(*row)
    console.print(table)
    if len(shown) < len(tensors):
        console.print(f"... and {len(tensors) - len(shown)} more tensors (use --limit or --json)")
    totals = info["totals"]
    console.print(f"{totals['tensors']} tensors, {totals['nbytes']:,} bytes ({_human(totals['nbytes'])})")
    for title, mapping in (("metadata", info["metadata"]), ("scalars", info["scalars"])):
        if mapping:
            t = Table(title=title, title_justify="left")
            t.add_column("key")
            t.add_column("value")
            for k, v in mapping.items():
                t.add_row(k, json.dumps(v) if not isinstance(v, str) else v)
            console.print(t)
    placeholders = info["details"].get("placeholders")
    if placeholders:  # objects of classes migrator does not build (a checkpoint's args, configs, callbacks)
        from rich.text import Text

        t = Table(title="objects not built (placeholders)", title_justify="left")
        t.add_column("key", overflow="fold")
        t.add_column("class", overflow="fold")
        for p in placeholders:
            t.add_row(Text(p["key"] or "(root)"), Text(p["class"]))
        console.print(t)


def _convert(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .convert import build_recipe, convert, emit_recipe

    extra: dict[str, str] = {}
    for item in args.metadata:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--metadata expects KEY=VALUE, got {item!r}")
        extra[key] = value
    for item in args.remap:
        if "=" not in item or item.startswith("="):
            parser.error(f"--remap expects REGEX=REPLACEMENT, got {item!r}")
    options = dict(source_format=args.source_format, target_format_name=args.target_format,
                   top_level_key=args.top_level_key, remaps=args.remap, includes=args.include, excludes=args.exclude,
                   adapters=args.adapter, dtype=args.dtype, contiguous_indices=args.contiguous_indices,
                   overwrite=args.overwrite, fsync=not args.no_fsync, metadata=extra, clear_metadata=args.no_metadata)
    try:
        if args.emit_recipe:
            sys.stdout.write(emit_recipe(build_recipe(args.src, args.dst, **options)))
            return EXIT_OK
        result = convert(args.src, args.dst, progress=False if args.no_progress else None, **options)
    except ValueError as e:  # pydantic's ValidationError: an option the recipe model refuses
        print(f"migrate convert: invalid option: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        json.dump(result.__dict__, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"wrote {result.target} ({result.target_format}): {result.tensors} tensors, "
              f"{_human(result.nbytes)} from {result.source} ({result.source_format})")
        for note in result.notes:
            print(f"  note: {note}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

"""The `migrate` command line. Imports stay inside commands so `migrate --help` starts fast."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

EXIT_OK, EXIT_MIGRATION, EXIT_USAGE = 0, 1, 2


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
    conv.add_argument("--from", dest="source_format", default="auto", help="source format (default: detect)")
    conv.add_argument("--to", dest="target_format", default="auto", help="target format (default: extension)")
    conv.add_argument("--top-level-key", help="PyTorch: the nested dict holding the tensors (dotted path)")
    conv.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                      help="add a metadata entry (repeatable)")
    conv.add_argument("--no-metadata", action="store_true", help="write no metadata at all")
    conv.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
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
    except MigratorError as e:
        print(f"migrate: error: {e}", file=sys.stderr)
        return EXIT_MIGRATION
    except KeyboardInterrupt:
        print("migrate: interrupted; no output was published", file=sys.stderr)
        return 130
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

    console = Console()
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


def _convert(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .convert import convert

    extra: dict[str, str] = {}
    for item in args.metadata:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--metadata expects KEY=VALUE, got {item!r}")
        extra[key] = value
    result = convert(args.src, args.dst, source_format=args.source_format, target_format_name=args.target_format,
                     overwrite=args.overwrite, metadata=extra, clear_metadata=args.no_metadata,
                     reader_options=_reader_options(args))
    if args.json:
        json.dump(result.__dict__, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"wrote {result.target} ({result.target_format}): {result.tensors} tensors, "
              f"{_human(result.nbytes)} from {result.source} ({result.source_format})")
        for d in result.dropped:
            print(f"  note: {d} has no place in {result.target_format} and was not written")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

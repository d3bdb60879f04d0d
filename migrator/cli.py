"""The `migrate` command line. Imports stay inside commands so `migrate --help` starts fast."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

EXIT_OK, EXIT_MIGRATION, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer killed by it
LIMIT_HELP = ("raise or lower a reader limit (repeatable; e.g. max_tensor_bytes=20GiB, max_nodes=5000000; "
              "sizes take units: 5GB = 5*10^9, 5GiB = 5*2^30; the names are in SECURITY.md)")
NO_FSYNC_HELP = ("publish without flushing to disk first (faster, like cp): never partial after a crash of "
                 "migrator, but a power loss soon after may lose the new file")


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as a JSON `{"error": ...}` object on stdout under `--json`."""

    json_errors = False  # set by main() from its argv, before parsing

    def error(self, message: str) -> NoReturn:
        if _Parser.json_errors:
            _print_json_error({"kind": "UsageError", "message": message, "usage": self.format_usage().strip()})
            sys.exit(EXIT_USAGE)
        super().error(message)


def _command(sub: Any, name: str, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description, epilog="examples:\n" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from . import __version__, adapter_names

    p = _Parser(
        prog="migrate",
        description="Move neural-network weights between burnpack (.bpk), SafeTensors and PyTorch files.",
        epilog="run `migrate COMMAND --help` for a command's arguments and examples",
    )
    p.add_argument("--version", action="version", version=f"migrator {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ins = _command(sub, "inspect", "list the tensors, metadata and scalars of a file",
                   "List a file's tensors (name, dtype, shape, size, offset in data order), its metadata and "
                   "scalars.\nReads headers only. Names from the file are shown literally, unprintable "
                   "characters escaped (\\x1b); --json keeps the exact strings.",
                   "  migrate inspect model.safetensors --limit 20\n"
                   "  migrate inspect ckpt.pt --top-level-key state_dict --json\n"
                   "  migrate inspect model.bpk --stats")
    ins.add_argument("file", help="a .bpk, .safetensors or PyTorch file")
    ins.add_argument("--json", action="store_true", help="print a JSON object instead of tables")
    ins.add_argument("--format", default="auto", help="auto | burnpack | safetensors | pytorch")
    ins.add_argument("--top-level-key", help="PyTorch: the nested dict holding the tensors (dotted path)")
    ins.add_argument("--limit", dest="limit_args", action="append", default=[], metavar="N | NAME=VALUE",
                     help="N: show at most N tensors in the table; NAME=VALUE: " + LIMIT_HELP)
    ins.add_argument("--stats", action="store_true", help="read every tensor (streamed): min, max, mean, std, "
                     "mean |x|, zeros, NaN/Inf; flags all-zero, all-equal, NaN/Inf tensors")
    ins.add_argument("--html", metavar="FILE", help="write the listing as a self-contained HTML page instead of "
                     "the table")
    ins.add_argument("--overwrite", action="store_true", help="replace an existing HTML page")

    conv = _command(sub, "convert", "convert a file to another format (format from each path)",
                    "Convert SRC to DST in one step (a one-off recipe): formats from the paths' extensions, "
                    "written\natomically, an existing DST refused without --overwrite.",
                    "  migrate convert model.safetensors model.bpk\n"
                    "  migrate convert ckpt.pt model.bpk --top-level-key state_dict --adapter pytorch_to_burn\n"
                    "  migrate convert ckpt.pt out/ --to burnpack   # writes out/ckpt.bpk")
    conv.add_argument("src", help="the file to read")
    conv.add_argument("dst", help="the file to write (its extension picks the format; none: burnpack, .bpk "
                      "appended); a folder (existing, or ending in '/'): one file in it named after SRC, "
                      "format from --to")
    conv.add_argument("--overwrite", action="store_true", help="replace an existing target")
    conv.add_argument("--no-fsync", action="store_true", help=NO_FSYNC_HELP)
    conv.add_argument("--from", dest="source_format", default="auto", help="source format (default: detect)")
    conv.add_argument("--to", dest="target_format", default="auto", help="target format (default: extension)")
    conv.add_argument("--top-level-key", help="the nested dict (PyTorch) or name prefix holding the tensors")
    conv.add_argument("--remap", action="append", default=[], metavar="REGEX=REPL", help="rename (repeatable, ordered)")
    conv.add_argument("--include", action="append", default=[], metavar="REGEX", help="keep only matching names")
    conv.add_argument("--exclude", action="append", default=[], metavar="REGEX", help="drop matching names")
    conv.add_argument("--adapter", action="append", default=[], metavar="NAME",
                      help=" | ".join(adapter_names.CLI_FORMS) + " (repeatable, chained in order)")
    conv.add_argument("--modules", action="append", default=[], metavar="TYPE=REGEX",
                      help="declare the module type of matching module paths, as a recipe's modules: "
                           "(repeatable; e.g. Linear='^fc\\d+$')")
    conv.add_argument("--dtype", metavar="DTYPE", help="cast every float tensor (F64, F32, Flex32, F16, BF16)")
    conv.add_argument("--contiguous-indices", action=argparse.BooleanOptionalAction, default=None,
                      help="renumber index segments 0,1,2,... (default: on for a PyTorch source written for Burn, "
                           "i.e. a .bpk target or --adapter pytorch_to_burn; the no- form keeps the names)")
    conv.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                      help="add a metadata entry (repeatable)")
    conv.add_argument("--no-metadata", action="store_true", help="write no metadata except --metadata entries")
    conv.add_argument("--max-shard-size", metavar="SIZE",
                      help="write DST as a folder of shards of at most SIZE (5GB = 5*10^9 bytes, 5GiB = 5*2^30, "
                      "an integer = bytes) plus an index (with --copy alone: 5GB shards); without either, "
                      "DST/ gets one file")
    conv.add_argument("--copy", action="append", default=[], metavar="GLOB",
                      help="copy matching companion files (config.json, 'tokenizer*') from the source folder into a "
                      "sharded DST (repeatable)")
    conv.add_argument("--emit-recipe", action="store_true",
                      help="print the equivalent recipe as YAML and convert nothing; with -o FILE, convert and "
                      "write the recipe of what ran to FILE")
    conv.add_argument("-o", "--recipe-output", metavar="FILE",
                      help="with --emit-recipe: the recipe file (written atomically after the output; refused if it "
                      "exists, unless --overwrite), its paths relative to FILE's folder")
    conv.add_argument("--json", action="store_true", help="print the result (or the error) as JSON")
    conv.add_argument("--no-progress", action="store_true", help="no progress bar")
    conv.add_argument("--limit", dest="limits", action="append", default=[], metavar="NAME=VALUE", help=LIMIT_HELP)

    run = _command(sub, "run", "run recipes: plan, stream, write atomically, report",
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
    run.add_argument("--jobs", type=_positive, metavar="N", help="jobs run at once, each in its own process "
                     "(default: the CPUs available; 1: one after the other); with one job: --workers")
    run.add_argument("--workers", type=_positive, metavar="W", help="write one job's output with W workers: "
                     "disjoint ranges of one .bpk/.safetensors file, or whole shards of a folder (default 1)")
    run.add_argument("--executor", choices=("local", "ray"), default=None,
                     help="where jobs and write tasks run: here (default), or as Ray tasks (pip install "
                     "'migrator[ray]'; paths must be on storage every node sees); wins over the recipe's executor:")
    run.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster to join (default: $RAY_ADDRESS, "
                     "else a local Ray started for the run)")
    run.add_argument("--limit", dest="limits", action="append", default=[], metavar="NAME=VALUE", help=LIMIT_HELP)

    plan = _command(sub, "plan", "show what a recipe would do (names, ops, dtypes, shapes); write nothing",
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

    val = _command(sub, "validate", "validate recipes and check their sources parse (headers only)",
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

    from .diff_cli import add_parser as add_diff

    add_diff(sub, _command)

    sch = _command(sub, "schema", "print the recipe JSON Schema",
                   "Print the recipe JSON Schema (for editors: yaml-language-server, VS Code).",
                   "  migrate schema -o recipe.schema.json\n"
                   "  migrate schema | jq '.properties | keys'")
    sch.add_argument("-o", "--output", metavar="FILE", help="write it to FILE (atomically) instead of stdout")
    sch.add_argument("--overwrite", action="store_true", help="replace an existing FILE")
    return p, dict(sub.choices)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def _print_json_error(error: dict[str, Any]) -> None:
    from .display import print_json
    print_json({"error": error})


def main(argv: Sequence[str] | None = None) -> int:
    """The `migrate` command: its exit code. The cyclic collector is off while the command runs:
    a command builds a few objects per tensor that all live until it ends (~1M for a 100k-tensor
    plan), which the collector would rescan over and over and never free, and cycles come only from
    hostile pickles, whose size the reader limits bound. Library calls never touch the collector."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        return _main(argv)
    finally:
        if enabled:
            gc.enable()


def _main(argv: Sequence[str] | None) -> int:
    # numpy starts an OpenBLAS thread pool at import whose threads spin between calls; migrator
    # does no linear algebra, so one thread (none started) is enough. A user's setting wins.
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = "--json" in argv
    parser, commands = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # an unknown option of a subcommand: that subcommand's usage, not the top-level one
        commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    _read_limits(args, commands[args.command])
    from .errors import MigratorError, error_json

    as_json = getattr(args, "json", False)
    try:
        if args.command == "inspect":
            return _inspect(args)
        if args.command == "convert":
            return _convert(args, commands["convert"])
        if args.command == "diff":
            from .diff_cli import run as diff

            return diff(args, commands["diff"], check_remap_options)
        if args.command in ("run", "plan", "validate", "schema"):
            recipes = getattr(args, "recipes", None) or []
            if len(recipes) > 1 and (getattr(args, "source", None) or getattr(args, "target", None)):
                commands[args.command].error("--source and --target apply to one recipe only")
            from . import recipe_cli

            return int(getattr(recipe_cli, args.command)(args))
    except MigratorError as e:
        code = _exit_code(e)
        if as_json:
            _print_json_error(error_json(e))
        else:
            from .display import escape

            print(f"migrate: error: {escape(e, keep_newlines=True)}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        if as_json:
            _print_json_error({"kind": "Interrupted", "message": "interrupted; no output was published"})
        print("migrate: interrupted; no output was published", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `migrate plan r.yaml | head`: the reader left; stop quietly, as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit-time flush must not fail too
        return EXIT_BROKEN_PIPE
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


def _read_limits(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """`--limit` settings -> `args.reader_limits` (a `Limits`); inspect's bare `--limit N` -> `args.limit`
    (rows shown). A bad setting is a usage error (exit 2) naming the closest limit."""
    settings = list(getattr(args, "limits", None) or [])
    if hasattr(args, "limit_args"):
        args.limit = None
        for item in args.limit_args:
            if "=" in item:
                settings.append(item)
                continue
            try:
                args.limit = int(item)
            except ValueError:
                parser.error(f"--limit: expected N (tensors shown) or NAME=VALUE (a reader limit), got {item!r}")
    if not settings:
        return
    from .limits import DEFAULT_LIMITS, LimitSettingError

    try:
        args.reader_limits = DEFAULT_LIMITS.with_settings(settings)
    except LimitSettingError as e:
        parser.error(str(e))


def _exit_code(e: Exception) -> int:
    """2 for a recipe the loader refuses, 1 for every other migrator error."""
    from .recipe_loader import RecipeError

    return EXIT_USAGE if isinstance(e, RecipeError) else EXIT_MIGRATION


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    return {"limits": args.reader_limits} if hasattr(args, "reader_limits") else {}


def _reader_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"top_level_key": args.top_level_key} if args.top_level_key else {}


def _inspect(args: argparse.Namespace) -> int:
    from .inspect import inspect_file

    if args.stats:
        from .stats import inspect_with_stats

        info = inspect_with_stats(args.file, format=args.format, **_reader_options(args), **_limits(args))
    else:
        info = inspect_file(args.file, format=args.format, **_reader_options(args), **_limits(args))
    if args.html:
        from .html_report import inspect_page, write_page

        write_page(args.html, inspect_page(info), overwrite=args.overwrite, protect=[args.file], make_folders=True)
    if args.json:
        _write_inspect_json(info, sys.stdout)
        return EXIT_OK
    if args.html:
        from .display import escape

        print(f"wrote {escape(args.html)}")
        return EXIT_OK
    _print_inspect(info, args.limit)
    return EXIT_OK


def _write_inspect_json(info: dict[str, Any], out: Any) -> None:
    """`info` as indented JSON, one tensor a line: `indent` makes `json` use its pure-Python
    encoder (~30 us a tensor), while each compact tensor line is encoded in C."""
    from .display import write_lines

    encode = json.JSONEncoder(default=str).encode  # one encoder: json.dumps(default=...) builds one a call
    lines = ["{"]
    for n, (key, value) in enumerate(info.items()):
        comma = "," if n < len(info) - 1 else ""
        if key == "tensors" and value:
            lines.append(f"  {json.dumps(key)}: [")
            lines += [f"    {encode(t)}," for t in value]
            lines[-1] = lines[-1][:-1]
            lines.append("  ]" + comma)
        else:
            lines.append(f"  {json.dumps(key)}: " + json.dumps(value, indent=2, default=str).replace("\n", "\n  ")
                         + comma)
    lines.append("}")
    write_lines(out, lines)


def _print_inspect(info: dict[str, Any], limit: int | None) -> None:
    from .display import count, human_bytes, print_table

    tensors = info["tensors"]
    with_ids = any("param_id" in t for t in tensors)
    sharded = any("file" in t for t in tensors)
    header = (["name", "dtype", "shape", "size", "offset"] + (["param_id"] if with_ids else [])
              + (["shard"] if sharded else []))
    with_stats = bool(tensors) and "stats" in tensors[0]
    if with_stats:
        from .stats import STATS_HEADER, stats_cells

        header += STATS_HEADER
    shown = tensors if limit is None else tensors[:limit]
    sizes: dict[int, str] = {}
    rows = []
    for t in shown:
        nbytes = t["nbytes"]
        size = sizes.get(nbytes) or sizes.setdefault(nbytes, human_bytes(nbytes))
        row = [t["name"], t["dtype"], str(t["shape"]), size, "-" if t["offset"] is None else str(t["offset"])]
        if with_ids:
            row.append(str(t.get("param_id", "")))
        if sharded:
            row.append(os.path.basename(t.get("file", "")))
        if with_stats:
            row += stats_cells(t)
        rows.append(row)
    title = f"{info['path']} ({info['format']}, {human_bytes(info['file_size'])})"
    right: tuple[int, ...] = (3, 4, 5) if with_ids else (3, 4)
    if with_stats:  # the numeric stats columns, not the flags
        right += tuple(range(len(header) - len(STATS_HEADER), len(header) - 1))
    print_table(title, header, rows, right=right)
    out = sys.stdout
    if len(shown) < len(tensors):
        out.write(f"... and {count(len(tensors) - len(shown), 'more tensor')} (use --limit or --json)\n")
    totals = info["totals"]
    out.write(f"{count(totals['tensors'], 'tensor')}, {human_bytes(totals['nbytes'])}\n")
    for flag, n in totals.get("flagged", {}).items():
        out.write(f"flagged {flag.replace('_', ' ')}: {count(n, 'tensor')}\n")
    _print_shards(info)
    for warning in info["details"].get("warnings", ()):  # ASCII (names in them are ascii()-escaped)
        print(f"warning: {warning}", file=sys.stderr)
    for title, mapping in (("metadata", info["metadata"]), ("scalars", info["scalars"])):
        if mapping:
            pairs = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in mapping.items()]
            out.write("\n")
            print_table(title, ("key", "value"), pairs, wrap_cols=(0, 1))
    placeholders = info["details"].get("placeholders")
    if placeholders:  # objects of classes migrator does not build (a checkpoint's args, configs, callbacks)
        out.write("\n")
        print_table("objects not built (placeholders)", ("key", "class"),
                    [(p["key"] or "(root)", p["class"]) for p in placeholders], wrap_cols=(0, 1))


def check_remap_options(items: list[str], parser: argparse.ArgumentParser) -> None:
    """`--remap REGEX=REPLACEMENT` values (convert, diff): a usage error for any a recipe would refuse."""
    for item in items:
        if "=" not in item or item.startswith("="):
            parser.error(f"--remap expects REGEX=REPLACEMENT, got {item!r}")
        problem = _remap_problem(*item.split("=", 1))
        if problem:
            parser.error(f"--remap '{item}': {problem}")


def _remap_problem(pattern: str, replacement: str) -> str | None:
    """What a recipe would refuse in this remap (bad regex or replacement, a group that does not exist)."""
    from .naming import NamingError, RemapRule

    try:
        problem = RemapRule(pattern, replacement).missing_group_problem()
    except NamingError as e:
        if e.message.startswith("invalid regex"):
            from .recipe import regex_problem

            return regex_problem(e)
        return e.message.replace(repr(replacement), f"'{replacement}'")  # as the user wrote it
    if problem is None:
        return None
    message, hint = problem
    return f"{message} (hint: {hint})" if hint else message


def _print_shards(info: dict[str, Any]) -> None:
    """A sharded source's per-shard summary: file, tensors, tensor bytes, file size."""
    from .display import human_bytes, print_table

    shards = info.get("details", {}).get("shards")
    if not shards:
        return
    index = info["details"].get("index")
    rows = [(os.path.basename(s["file"]), str(s["tensors"]), human_bytes(s["nbytes"]), human_bytes(s["file_size"]))
            for s in shards]
    sys.stdout.write("\n")
    print_table(f"{len(shards)} shards" + (f" (index {index})" if index else ""),
                ("shard", "tensors", "size", "file size"), rows, right=(1, 2, 3))


def _folder_target(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """`convert SRC DIR/` (an existing folder, or a path ending in '/') without a shard option: one
    file in DIR, named after the source with the --to format's extension (`DIR/model.bpk`). --to is
    required there: a folder has no extension to take the format from. With --max-shard-size or
    --copy, DIR/ is a Hugging Face model folder of shards instead. Any other DST is used as given."""
    dst: str = args.dst
    if args.max_shard_size or args.copy:
        return dst
    if not (dst.endswith(("/", os.sep)) or os.path.isdir(dst)):
        return dst
    if args.target_format == "auto":
        parser.error(f"'{dst}' is a folder: give the format with --to (burnpack, safetensors or pytorch); "
                     "the file is named after the source")
    from pathlib import Path

    from .formats import writer_class
    from .formats.detect import FORMATS

    if args.target_format not in FORMATS:
        parser.error(f"--to: unknown format '{args.target_format}' (use one of {', '.join(FORMATS)})")
    return os.path.join(dst, Path(args.src).stem + writer_class(args.target_format).default_extension)


def _recipe_output_check(args: argparse.Namespace) -> None:
    """`-o FILE` is refused before converting what the write after it would refuse."""
    from pathlib import Path

    from .atomic import check_target

    check_target(Path(args.recipe_output), overwrite=args.overwrite, protect=[args.src], outputs=[args.dst])


def _write_recipe(args: argparse.Namespace, text: str) -> str | None:
    """Write the recipe of what ran to `-o FILE` (atomically, after the output); the problem, if any."""
    from .atomic import write_file
    from .errors import MigratorError

    try:
        write_file(args.recipe_output, text.encode(), overwrite=args.overwrite, protect=[args.src],
                   outputs=[args.dst], fsync=not args.no_fsync, make_folders=True)
    except MigratorError as e:
        return str(e)
    return None


def _check_convert_values(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Values a recipe would refuse at its LINE:COL are usage errors here (exit 2, JSON with --json),
    found before any file is opened: the shard size, and a target whose format cannot be told."""
    if args.max_shard_size is not None:
        from .formats.sharded_writer import parse_size

        try:
            parse_size(args.max_shard_size)
        except ValueError as e:
            parser.error(f"--max-shard-size: {e}")
    from .errors import UnknownFormatError
    from .formats.detect import FORMATS, target_format

    for option, value in (("--from", args.source_format), ("--to", args.target_format)):
        if value != "auto" and value not in FORMATS:
            parser.error(f"{option}: unknown format '{value}' (formats: {', '.join(FORMATS)})")
    folder = args.max_shard_size is not None or str(args.dst).endswith(("/", os.sep))
    if not folder:
        try:
            target_format(args.dst, args.target_format)
        except UnknownFormatError as e:
            parser.error(f"{e.detail} (--to {'|'.join(FORMATS)})")


def _convert(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .convert import ConvertUsageError, build_recipe, convert, emit_recipe

    extra: dict[str, str] = {}
    for item in args.metadata:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--metadata expects KEY=VALUE, got {item!r}")
        extra[key] = value
    check_remap_options(args.remap, parser)
    _check_convert_values(args, parser)
    if args.recipe_output and not args.emit_recipe:
        parser.error("-o/--recipe-output FILE is where --emit-recipe writes the recipe: add --emit-recipe")
    args.dst = _folder_target(args, parser)
    options = dict(source_format=args.source_format, target_format_name=args.target_format,
                   top_level_key=args.top_level_key, remaps=args.remap, includes=args.include, excludes=args.exclude,
                   adapters=args.adapter, dtype=args.dtype, modules=args.modules,
                   contiguous_indices=args.contiguous_indices,
                   overwrite=args.overwrite, fsync=not args.no_fsync, metadata=extra, clear_metadata=args.no_metadata)
    if args.max_shard_size or args.copy:  # only when given: options a plain copy takes stay as they were
        options.update(max_shard_size=args.max_shard_size, copy=args.copy)
    recipe_text = None
    try:
        if args.emit_recipe:  # alone: print the recipe, convert nothing; with -o FILE: convert, record it there
            recipe = build_recipe(args.src, args.dst, **options)
            from pathlib import Path

            from .plan import renumbers_by_default

            if renumbers_by_default(recipe, Path(os.getcwd()), **_limits(args)):  # write out what the default does
                options["contiguous_indices"] = True
                recipe = build_recipe(args.src, args.dst, **options)
            recipe_text = emit_recipe(recipe, args.recipe_output)
            if not args.recipe_output:
                sys.stdout.write(recipe_text)
                return EXIT_OK
            _recipe_output_check(args)
        import hashlib

        sha = hashlib.sha256(recipe_text.encode()).hexdigest() if recipe_text else None
        result = convert(args.src, args.dst, progress=False if args.no_progress else None, recipe_sha256=sha,
                         **options, **_limits(args))
    except ConvertUsageError as e:  # an option the recipe model refuses, in the recipe's words
        if args.json:
            _print_json_error({"kind": "UsageError", "message": str(e)})
        else:
            from .display import escape

            print(f"migrate convert: {escape(e, keep_newlines=True)}", file=sys.stderr)
        return EXIT_USAGE
    problem = _write_recipe(args, recipe_text) if recipe_text is not None else None
    if args.json:
        doc = result.__dict__ | ({"recipe": args.recipe_output} if recipe_text is not None and not problem else {})
        from .display import print_json
        print_json(doc)
    else:
        from .display import count, escape, human_bytes

        print(f"wrote {escape(result.target)} ({result.target_format}): {count(result.tensors, 'tensor')}, "
              f"{human_bytes(result.nbytes)} from {escape(result.source)} ({result.source_format})")
        for note in result.notes:
            print(f"  note: {escape(note, keep_newlines=True)}")
        if recipe_text is not None and not problem:
            print(f"wrote {escape(args.recipe_output)}, the recipe of this conversion (again: migrate run "
                  f"{escape(args.recipe_output)} --overwrite)")
    if problem:
        from .display import escape

        print(f"migrate: error: wrote {escape(result.target)}, but the recipe was not written: "
              f"{escape(problem, keep_newlines=True)}", file=sys.stderr)
        return EXIT_MIGRATION
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

"""The `migrate` command line. Imports stay inside commands so `migrate --help` starts fast."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..core.errors import EXIT_USAGE
from .options import OLD_SPELLINGS, command, old_spellings_used
from .output import print_json_error

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer killed by it


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as a JSON `{"error": ...}` object on stdout under `--json`."""

    json_errors = False  # set by main() from its argv, before parsing

    def error(self, message: str) -> NoReturn:
        for old, new in OLD_SPELLINGS.items():  # "argument --from/--format": the spelling in use only
            message = message.replace(f"{new}/{old}", new)
        if _Parser.json_errors:
            print_json_error({"kind": "UsageError", "message": message, "usage": self.format_usage().strip()})
            sys.exit(EXIT_USAGE)
        super().error(message)


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from ..core.version import __version__
    from ..formats.registry import listed, specs

    files = listed([s.title + (f" ({s.extension})" if s.for_burn else "") for s in specs() if s.writable], "and")
    folders = listed([s.title for s in specs() if s.folder], "and")
    p = _Parser(
        prog="migrate",
        description=f"Move neural-network weights between {files} files; read {folders} folders too.",
        epilog="run `migrate COMMAND --help` for a command's arguments and examples",
    )
    p.add_argument("--version", action="version", version=f"migrator {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    # each command's module adds its own parser; in this order, `migrate --help` lists them
    from . import convert, diff, inspect, merge, recipe

    inspect.add_parser(sub)
    convert.add_parser(sub)
    recipe.add_run_parser(sub)
    recipe.add_plan_parser(sub)
    recipe.add_validate_parser(sub)
    diff.add_parser(sub, command)
    merge.add_parser(sub)
    recipe.add_schema_parser(sub)
    return p, dict(sub.choices)


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
    for note in _read_limits(args, commands[args.command]) + old_spellings_used(argv, commands[args.command]):
        print(f"migrate: note: {note}", file=sys.stderr)
    from ..core.errors import MigratorError, error_json

    as_json = getattr(args, "json", False)
    try:
        if args.command == "inspect":
            from .inspect import run as inspect

            return inspect(args)
        if args.command == "convert":
            from .convert import run as convert

            return convert(args, commands["convert"])
        if args.command == "merge":
            from .merge import run as merge

            return merge(args, commands["merge"])
        if args.command == "diff":
            from .diff import run as diff

            return diff(args, commands["diff"])
        if args.command in ("run", "plan", "validate", "schema"):
            recipes = getattr(args, "recipes", None) or []
            if len(recipes) > 1 and (getattr(args, "source", None) or getattr(args, "target", None)):
                commands[args.command].error("--source and --target apply to one recipe only")
            from . import recipe as recipe_cli

            return int(getattr(recipe_cli, args.command)(args))
    except MigratorError as e:
        code = e.exit_code
        if as_json:
            print_json_error(error_json(e))
        else:
            from ..core.display import clip_words, escape

            print(f"migrate: error: {clip_words(escape(e, keep_newlines=True))}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        if as_json:
            print_json_error({"kind": "Interrupted", "message": "interrupted; no output was published"})
        print("migrate: interrupted; no output was published", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `migrate plan r.yaml | head`: the reader left; stop quietly, as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit-time flush must not fail too
        return EXIT_BROKEN_PIPE
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE


def _read_limits(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """`--limit` settings -> `args.reader_limits` (a `Limits`); inspect's bare `--limit N`, the old
    spelling of `--rows N`, -> `args.rows` (a reader limit is always NAME=VALUE, so the two cannot be
    confused). A bad setting is a usage error (exit 2) naming the closest limit. The notes to print."""
    settings = list(getattr(args, "limits", None) or [])
    notes = []
    if hasattr(args, "limit_args"):
        for item in args.limit_args:
            if "=" in item:
                settings.append(item)
                continue
            try:
                rows = int(item)
            except ValueError:
                parser.error(f"--limit: expected NAME=VALUE (a reader limit), got {item!r}")
            if rows < 0:
                parser.error(f"--limit: expected a number of rows (0 or more), got '{item}'")
            if args.rows is None:  # --rows N wins over the old spelling
                args.rows = rows
            notes.append(f"--limit {item} (rows shown) is now spelled --rows {item} (the old spelling still works)")
    if not settings:
        return notes
    from ..core.limits import DEFAULT_LIMITS, LimitSettingError

    try:
        args.reader_limits = DEFAULT_LIMITS.with_settings(settings)
    except LimitSettingError as e:
        parser.error(str(e))
    return notes

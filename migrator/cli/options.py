"""What several commands share: how a command's parser is made, the `--limit` and `--no-fsync`
help, the checks of `--remap`, and the reader options from the command line."""

from __future__ import annotations

import argparse
from typing import Any

LIMIT_HELP = ("raise or lower a reader limit (repeatable; e.g. max_tensor_bytes=20GiB, max_nodes=5000000; "
              "sizes take units: 5GB = 5*10^9, 5GiB = 5*2^30; the names are in SECURITY.md)")
NO_FSYNC_HELP = ("publish without flushing to disk first (faster, like cp): never partial after a crash of "
                 "migrator, but a power loss soon after may lose the new file")


def add_limit_option(parser: Any) -> None:
    """`--limit NAME=VALUE` (repeatable), as every command reading files takes it."""
    parser.add_argument("--limit", dest="limits", action="append", default=[], metavar="NAME=VALUE", help=LIMIT_HELP)


def command(sub: Any, name: str, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description, epilog="examples:\n" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def limits_of(args: argparse.Namespace) -> dict[str, Any]:
    return {"limits": args.reader_limits} if hasattr(args, "reader_limits") else {}


def reader_options(args: argparse.Namespace) -> dict[str, Any]:
    options = {"top_level_key": args.top_level_key} if args.top_level_key else {}
    if getattr(args, "tag", None):  # a DeepSpeed ZeRO folder's step (inspect)
        options["tag"] = args.tag
    return options


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
    from ..naming import NamingError, RemapRule

    try:
        problem = RemapRule(pattern, replacement).missing_group_problem()
    except NamingError as e:
        if e.message.startswith("invalid regex"):
            from ..ops.checks import regex_problem

            return regex_problem(e)
        return e.message.replace(repr(replacement), f"'{replacement}'")  # as the user wrote it
    if problem is None:
        return None
    message, hint = problem
    return f"{message} (hint: {hint})" if hint else message

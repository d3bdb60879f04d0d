"""What several commands share: how a command's parser is made (its options from a table's rows,
old spellings hidden), the `--limit` and `--no-fsync` help, the checks of `--remap`, and the reader
options from the command line."""

from __future__ import annotations

import argparse
import copy
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..recipe.convert_options import Option

OLD_SPELLINGS: dict[str, str] = {"--format": "--from", "--a-format": "--from", "--b-format": "--to"}
"""Old option spellings -> the one used now. They still parse (no script breaks), `--help` does not
show them, and using one prints a note (docs/commands.md, "Old spellings")."""

LIMIT_HELP = ("raise or lower a reader limit (repeatable; e.g. max_tensor_bytes=20GiB, max_nodes=5000000; "
              "sizes take units: 5GB = 5*10^9, 5GiB = 5*2^30; the names are in SECURITY.md)")
NO_FSYNC_HELP = ("publish without flushing to disk first (faster, like cp): never partial after a crash of "
                 "migrator, but a power loss soon after may lose the new file")


def add_limit_option(parser: Any) -> None:
    """`--limit NAME=VALUE` (repeatable), as every command reading files takes it."""
    parser.add_argument("--limit", dest="limits", action="append", default=[], metavar="NAME=VALUE", help=LIMIT_HELP)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`--help` as written (descriptions keep their lines), without the old spellings of an option."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = [s for s in action.option_strings if s not in OLD_SPELLINGS]
        if len(shown) != len(action.option_strings):
            action = copy.copy(action)
            action.option_strings = shown
        return super()._format_action_invocation(action)

    def _split_lines(self, text: str, width: int) -> list[str]:
        # never cut at a hyphen: a format's name ("Megatron-core torch_dist") stays whole on its line
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def command(sub: Any, name: str, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description, epilog="examples:\n" + examples, formatter_class=HelpFormatter)
    return parser


def old_spellings_used(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """The notes for every old spelling `argv` used that `parser` takes."""
    taken = {s for a in parser._actions for s in a.option_strings}
    used = {arg.partition("=")[0] for arg in argv if arg.startswith("--")}
    return [f"{old} is now spelled {new} (the old spelling still works)"
            for old, new in OLD_SPELLINGS.items() if old in used and old in taken]


class Later(Sequence[str]):
    """A list computed when first used (a value checked, or `--help` shown), not when the parser is
    built: `migrate --help` must not import what the list comes from."""

    def __init__(self, make: Callable[[], Sequence[str]], joiner: str = ", ") -> None:
        self._make = make
        self._joiner = joiner
        self._items: tuple[str, ...] | None = None

    def _all(self) -> tuple[str, ...]:
        if self._items is None:
            self._items = tuple(self._make())
        return self._items

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __contains__(self, value: object) -> bool:
        return value in self._all()

    def __str__(self) -> str:  # `%(listed)s` in a help text
        return self._joiner.join(self._all())


def _one_of(choices: Later, noun: str) -> Callable[[str], str]:
    """A value checked against `choices`, refused in one line that lists them (with a guess)."""
    def check(value: str) -> str:
        if value in choices:
            return value
        from ..naming.similarity import did_you_mean

        guess = did_you_mean(value, list(choices))
        lead = f"did you mean '{guess}'? " if guess else ""
        raise argparse.ArgumentTypeError(f"unknown {noun} '{value}' ({lead}{noun}s: {choices})")

    return check


def add_rows(parser: argparse.ArgumentParser, rows: Sequence[Option], defaults: Any, *,
             groups: Mapping[str, Any] | None = None, old: Mapping[str, Sequence[str]] | None = None,
             text: Callable[[str], str] = str) -> None:
    """Options from a table's rows (`recipe/convert_options.py`): `defaults` holds each row's default
    (an options object), `groups` where each row's group goes, `old` a field's old spellings, `text`
    rewrites each help (`diff`: A and B for SRC and DST)."""
    for r in rows:
        where = groups[r.group] if groups is not None else parser
        strings = [r.flag, *(old or {}).get(r.name, ())]
        default = getattr(defaults, r.name)
        kwargs: dict[str, Any] = {"dest": r.name, "help": text(r.help)}
        if r.kind in ("value", "number", "integer"):
            kwargs.update(default=default, metavar=r.metavar, type={"number": float, "integer": int}.get(r.kind))
        elif r.kind in ("repeat", "pairs"):
            kwargs.update(action="append", default=[], metavar=r.metavar)
        elif r.kind == "switch":
            kwargs.update(action="store_true")
        elif r.kind == "off":
            kwargs.update(action="store_false")
        elif r.kind == "toggle":
            kwargs.update(action=argparse.BooleanOptionalAction, default=default)
        if r.choices is not None:
            choices = Later(r.choices)
            kwargs["choices"] = choices
            if r.metavar is not None:  # a named list (formats): refused in migrator's words
                kwargs["type"] = _one_of(choices, r.metavar.lower())
        if kwargs.get("type") is None:
            kwargs.pop("type", None)
        action = where.add_argument(*strings, **kwargs)
        if r.listed is not None or r.choices is not None:  # `%(listed)s` in its help: the values, or the choices
            listed = Later(r.listed) if r.listed is not None else Later(r.choices or tuple, " | ")
            action.listed = listed  # type: ignore[union-attr]


def rows_given(args: argparse.Namespace, rows: Sequence[Option], parser: argparse.ArgumentParser) -> dict[str, Any]:
    """{field: value} of the rows' options as given (repeated ones as tuples, KEY=VALUE pairs as a
    dict: a malformed pair is a usage error)."""
    given: dict[str, Any] = {}
    for r in rows:
        value = getattr(args, r.name)
        if r.kind == "repeat":
            value = tuple(value)
        elif r.kind == "pairs":
            pairs: dict[str, str] = {}
            for item in value:
                key, sep, v = item.partition("=")
                if not sep or not key:
                    parser.error(f"{r.flag} expects KEY=VALUE, got {item!r}")
                pairs[key] = v
            value = pairs
        given[r.name] = value
    return given


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def count(text: str) -> int:
    """A number of rows: 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of rows (0 or more), got '{text}'")
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

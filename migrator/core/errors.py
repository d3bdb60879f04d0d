"""Typed errors. Every message names the file and, where there is one, the tensor.

Callers catch `MigratorError` to tell a user's bad input from a bug in migrator. Messages hold
names and paths from files exactly; the CLI escapes them for a terminal (`display.escape`) and
`--json` prints them exactly (`error_json`).
"""

from __future__ import annotations

from typing import Any, ClassVar

EXIT_OK, EXIT_MIGRATION, EXIT_USAGE = 0, 1, 2
"""The exit codes of every command: success, a migration (data) error, a usage error."""


LOCAL_SHARD_SEP = ".\x00"
"""Between a ShardedTensor's name and its local shard's index in a rank reader's own tensor names
(`formats.pytorch.sharded_tensor.local_name`): no key torch writes holds a NUL."""


def shown_tensor(tensor: str) -> str:
    """How an error names a tensor: a rank reader's internal name of a local shard (`w.<NUL>0`) as the
    ShardedTensor and the shard it is, never with the NUL."""
    name, sep, index = tensor.partition(LOCAL_SHARD_SEP)
    return f"tensor '{name}' (local shard {index})" if sep else f"tensor '{tensor}'"


class MigratorError(Exception):
    """Base of every error migrator raises on purpose; `exit_code` is what a command exits with."""

    exit_code: ClassVar[int] = EXIT_MIGRATION

    def __init__(self, message: str, *, file: str | None = None, tensor: str | None = None) -> None:
        self.file = file
        self.tensor = tensor
        self.detail = message
        parts = []
        if file:
            parts.append(str(file))
        if tensor is not None:
            parts.append(shown_tensor(tensor))
        parts.append(message)
        super().__init__(": ".join(parts))

    def __reduce__(self) -> tuple[Any, ...]:
        # A run's outcome crosses processes (a job's worker, a Ray task) with its error: rebuilt from
        # its state, not by calling __init__ again (subclasses take other arguments: RecipeError's issues).
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type[MigratorError], args: tuple[Any, ...], state: dict[str, Any]) -> MigratorError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


def error_json(e: BaseException) -> dict[str, Any]:
    """An error as the CLI's `--json` prints it: `kind` (the class name), `message` (the full text,
    exact: not escaped for a terminal), `file` and `tensor` where known, and a recipe's `issues`."""
    out: dict[str, Any] = {"kind": type(e).__name__, "message": str(e),
                           "file": None if getattr(e, "file", None) is None else str(e.file),  # type: ignore[attr-defined]
                           "tensor": getattr(e, "tensor", None)}
    issues = getattr(e, "issues", None)
    if issues is not None:
        out["issues"] = [{"file": i.file, "line": i.line, "col": i.col, "loc": i.loc, "message": i.message,
                          "hint": i.hint} for i in issues]
    return out


class FormatError(MigratorError):
    """A file is not valid in the format it claims (bad header, bad offsets, corrupt metadata)."""


class LimitExceededError(FormatError):
    """A file declares more than a reader accepts (sizes are checked before allocating)."""


class UnknownFormatError(MigratorError):
    """Neither the magic bytes nor the extension identify a supported format."""


class UnsupportedDTypeError(MigratorError):
    """A dtype the source cannot describe or the target format cannot hold."""


class TensorNotFoundError(MigratorError, KeyError):
    """A tensor name looked up in a file does not exist."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return Exception.__str__(self)


class ReaderClosedError(MigratorError):
    """A tensor's bytes were asked for after the reader that listed it was closed."""


class TensorBytesSizeMismatchError(MigratorError):
    """A lazy tensor produced a different number of bytes than it declared."""


class PlanError(MigratorError):
    """A write cannot be planned (duplicate names, lengths that contradict shapes, limits)."""


class TargetExistsError(MigratorError):
    """The output exists and overwriting was not asked for."""


class SameFileError(MigratorError):
    """The output would replace one of the files being read."""


class OutputError(MigratorError):
    """Writing the output failed (disk full, permissions, rename); the old target is intact."""


class UnsafePickleError(FormatError):
    """A pickle asks for something migrator refuses to construct or call."""


class MergeInputError(MigratorError):
    """Merge inputs that cannot be combined: a missing tensor, shapes or dtypes that disagree. A bad
    mergekit YAML is a `recipe.issues.RecipeError` (exit 2) with the YAML line and column instead."""


class AdapterError(MigratorError):
    """A PEFT adapter migrator cannot fold: an unsupported feature, or a tensor matching no base weight."""


def not_written(problems: list[str]) -> str:
    """The one-line error of a plan that cannot run: a CLI error is one line (a script greps it, a
    terminal shows it whole), so several problems are joined with '; '."""
    return "migration not written: " + "; ".join(problems)

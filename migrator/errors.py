"""Typed errors. Every message names the file and, where there is one, the tensor.

Callers catch `MigratorError` to tell a user's bad input from a bug in migrator.
"""

from __future__ import annotations


class MigratorError(Exception):
    """Base of every error migrator raises on purpose."""

    def __init__(self, message: str, *, file: str | None = None, tensor: str | None = None) -> None:
        self.file = file
        self.tensor = tensor
        self.detail = message
        parts = []
        if file:
            parts.append(str(file))
        if tensor is not None:
            parts.append(f"tensor '{tensor}'")
        parts.append(message)
        super().__init__(": ".join(parts))


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

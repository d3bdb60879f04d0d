"""A recipe problem as the user sees it: `recipe.yaml:LINE:COL: field.path: message (hint: ...)`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import EXIT_USAGE, MigratorError


@dataclass(frozen=True)
class RecipeIssue:
    """One problem in a recipe. `line`/`col` are 1-based; 0 means the file as a whole."""

    file: str
    line: int
    col: int
    loc: str
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        parts = [f"{self.file}:{self.line}:{self.col}" if self.line else self.file]
        if self.loc:
            parts.append(self.loc)
        parts.append(self.message)
        text = ": ".join(parts)
        return f"{text} (hint: {self.hint})" if self.hint else text


class RecipeError(MigratorError):
    """A recipe that cannot be used; every problem found is in `issues`, one line each in str()."""

    exit_code = EXIT_USAGE

    def __init__(self, issues: Sequence[RecipeIssue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))
        self.file = self.issues[0].file if self.issues else None

    def __str__(self) -> str:
        return "\n".join(str(i) for i in self.issues)


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


def _render_loc(data: Sequence[Any]) -> str:
    """`target.metadata['a.b']`, `remap[0].from`: the path as the user would point at it."""
    out: list[str] = []
    for seg in data:
        if seg == "[key]":
            continue
        if type(seg) is int:
            out.append(f"[{seg}]")
        elif isinstance(seg, str) and _PLAIN_KEY.match(seg):
            out.append(f".{seg}" if out else seg)
        else:
            out.append(f"[{_quote_key(seg)}]")
    return "".join(out)


def _quote_key(key: Any) -> str:
    return f"'{key}'" if isinstance(key, str) else _yaml_scalar(key)


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


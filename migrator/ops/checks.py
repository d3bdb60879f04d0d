"""What the recipe's validators share: how a complaint is raised, and the check of a regex.

Below the recipe's models (`recipe/model.py`) and every op's options (`ops/`), which all validate with these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic_core import PydanticCustomError

if TYPE_CHECKING:
    from ..naming import NamingError

RECIPE_VALUE = "recipe_value"
"""The error type of a validator's complaint (see `recipe_value_error`)."""


def recipe_value_error(message: str, *, key: str | None = None, hint: str | None = None) -> PydanticCustomError:
    """A validator's complaint as pydantic's own error, carrying what a precise report needs.

    Its type is RECIPE_VALUE and its context holds `message`, `key` (a sub-key of the object that
    failed, for checks that span several keys) and `hint`, so the loader (`placement.py`) reads them from the
    error instead of parsing message text. The rendered message is `message` alone, so pydantic's own
    rendering stays readable for callers that validate data without the loader.
    """
    return PydanticCustomError(RECIPE_VALUE, "{message}", {"message": message, "key": key, "hint": hint})


def check_regex(value: str) -> str:
    """Compile now so that a bad pattern is a validation error, never a crash mid-run."""
    from ..naming import NamingError, compile_regex

    try:
        compile_regex(value)
    except NamingError as e:
        raise recipe_value_error(regex_problem(e)) from e
    return value


def regex_problem(e: NamingError) -> str:
    """One line naming the pattern, the problem and where it is (0-based, like Python's re)."""
    detail = e.message.removeprefix("invalid regex: ")
    if e.position is None:
        where = ""
    elif e.position >= len(e.pattern):
        where = " at the end"
    else:
        where = f" at position {e.position}"
    return f"invalid regex '{e.pattern}'{where}: {detail}"

"""A recipe filter's criteria (include or exclude) as one predicate over tensor names."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Protocol

from ..core.errors import PlanError
from .regex import compile_regex

__all__ = ["NameFilter"]


class _CriterionLike(Protocol):
    """What a criterion holds (`recipe.CriterionSpec`): exactly one of the three is set."""

    regex: str | None
    path: str | None
    predicate: str | None


class NameFilter:
    """True for a name that any criterion selects: a regex searched anywhere, an exact path, or an
    imported predicate. Predicates are imported here, when a plan is built, never while a recipe is
    validated (importing user code runs it)."""

    def __init__(self, criteria: Sequence[_CriterionLike]) -> None:
        self.regexes = [compile_regex(c.regex) for c in criteria if c.regex is not None]
        self.paths = {c.path for c in criteria if c.path is not None}
        self.predicates = [_import_predicate(c.predicate) for c in criteria if c.predicate is not None]

    def __call__(self, name: str) -> bool:
        return (name in self.paths or any(r.search(name) for r in self.regexes)
                or any(p(name) for p in self.predicates))


def _import_predicate(spec: str) -> Callable[[str], bool]:
    module, _, func = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise PlanError(f"filter predicate '{spec}' cannot be imported: {e}") from None
    if not callable(fn):
        raise PlanError(f"filter predicate '{spec}' is not callable")
    return fn

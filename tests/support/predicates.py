"""Filter predicates that test recipes import by `module:function` (the module importable from the
repository root, as a user's own module is from where they run migrate)."""

from __future__ import annotations


def keep_bias(name: str) -> bool:
    """A filter predicate imported by a recipe (`tests.support.predicates:keep_bias`)."""
    return name.endswith(".bias")

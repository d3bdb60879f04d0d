"""The errors a merge or a LoRA fold raises: each names the tensors (and files) it is about.

Both are data errors (exit 1): the inputs disagree with each other or with what was asked. A bad
mergekit YAML is a `recipe_issues.RecipeError` (exit 2) with the YAML line and column instead.
"""

from __future__ import annotations

from ..errors import MigratorError


class MergeInputError(MigratorError):
    """Merge inputs that cannot be combined: a missing tensor, shapes or dtypes that disagree."""


class AdapterError(MigratorError):
    """A PEFT adapter migrator cannot fold: an unsupported feature, or a tensor matching no base weight."""

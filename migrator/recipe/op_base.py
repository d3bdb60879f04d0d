"""What every `ops:` entry's model shares (`ops.py`, `merge_ops.py`): the base model, regex and
template checks, `$i` substitution and the number types; below both so neither imports the other."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

_INDEX_REF = re.compile(r"\$\$|\$\{i\}|\$i(?![A-Za-z0-9_])")


def substitute_index(text: str, index: int | None) -> str:
    """`text` with every `$i` / `${i}` replaced by `index` (`$$` is left for the remap syntax)."""
    if index is None:
        return text
    return _INDEX_REF.sub(lambda m: m.group(0) if m.group(0) == "$$" else str(index), text)


def has_index_ref(text: str) -> bool:
    return any(m.group(0) != "$$" for m in _INDEX_REF.finditer(text))


def _problem(message: str, *, key: str | None = None, hint: str | None = None) -> Exception:
    from .checks import recipe_value_error

    return recipe_value_error(message, key=key, hint=hint)


def _regex(value: str) -> str:
    from .checks import check_regex

    return check_regex(value)


def _no_bool(value: object) -> object:
    if isinstance(value, bool):
        raise _problem(f"expected a number, got {str(value).lower()}")
    return value


def _no_bools(value: object) -> object:
    if isinstance(value, list):
        for v in value:
            _no_bool(v)
    return value


Pattern = Annotated[str, AfterValidator(_regex)]
Int = Annotated[int, BeforeValidator(_no_bool), WithJsonSchema({"anyOf": [
    {"type": "integer"},
    {"type": "string", "pattern": r"^\$\{.*\}$", "description": "A value from the model's config, resolved when "
     "the recipe is loaded: ${config.KEY}, with fallbacks after '|' (${config.num_key_value_heads | "
     "config.num_attention_heads}) and * or // between terms."}]})]
Ints = Annotated[list[int], BeforeValidator(_no_bools)]


def whole_name_pattern(pattern: str) -> str:
    """`pattern` anchored to the whole name (same groups, same numbering)."""
    return f"^(?:{pattern})$"


def check_template(pattern: str, template: str, key: str, *, index_ok: bool) -> None:
    """`template` may refer only to groups `pattern` has (and to `$i` where `index_ok`)."""
    from ..naming import NamingError, RemapRule

    if has_index_ref(template) and not index_ok:
        raise _problem(f"'{template}' uses $i, but this op has no part index", key=key,
                       hint="$i is the part number of split and unstack outputs")
    try:
        rule = RemapRule(whole_name_pattern(pattern), substitute_index(template, 0))
    except NamingError as e:
        raise _problem(e.message, key=key) from None
    problem = rule.missing_group_problem()
    if problem is not None:
        raise _problem(problem[0], key=key, hint=problem[1])


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

    optional: bool = Field(False, description="A `from` pattern matching no tensor is not an error.")

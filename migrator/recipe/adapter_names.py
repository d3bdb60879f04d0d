"""The adapters a recipe or `convert --adapter` can name: the one list the schema, the command
line's choices and the loader's hints are built from.

Light on purpose (no numpy, no pydantic): `recipe.py` builds its `AdapterName` from it at import,
and `adapters.build_adapter` maps the same names to the adapter classes.
"""

from __future__ import annotations

NAMED: tuple[str, ...] = ("identity", "pytorch_to_burn", "burn_to_pytorch", "half_precision")
"""Adapters written as a bare name (`adapters: [pytorch_to_burn]`)."""

WITH_OPTIONS: dict[str, str] = {
    "half_precision": "{half_precision: {...}}",  # also a bare name: the default module set
    "float_cast": "{float_cast: {to: DTYPE}}",
}
"""Adapters written as a one-key mapping of options, with how a recipe spells them."""

ALL: tuple[str, ...] = (*NAMED, *(n for n in WITH_OPTIONS if n not in NAMED))
"""Every adapter name, in the order hints list them."""

RECIPE_SPELLINGS: tuple[str, ...] = (*NAMED, *WITH_OPTIONS.values())
"""How a recipe's `adapters:` entries may be written, for the loader's "valid adapters" hint."""

CLI_FORMS: tuple[str, ...] = (*NAMED, "float_cast:DTYPE")
"""How `convert --adapter` takes them (an option mapping has no command-line form but float_cast's)."""

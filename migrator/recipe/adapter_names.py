"""The adapters a recipe or `convert --adapter` can name: the one list the schema, the command
line's choices and the loader's hints are built from.

Light on purpose (no numpy, no pydantic): `model.py` builds its `AdapterName` from it at import,
and `adapters.build_adapter` maps the same names to the adapter classes. The half_precision
adapter's module set is here too: the recipe checks its `with`/`without` options at validation.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def qualify(name: str) -> str:
    """Burn's rule: a name with ':' is kept (``Enum:X``), else it is a struct (``Struct:X``)."""
    return name if ":" in name else f"Struct:{name}"


DEFAULT_HALF_PRECISION_MODULES: frozenset[str] = frozenset({
    "Struct:Linear", "Struct:Embedding", "Struct:Conv1d", "Struct:Conv2d", "Struct:Conv3d",
    "Struct:ConvTranspose1d", "Struct:ConvTranspose2d", "Struct:ConvTranspose3d", "Struct:DeformConv2d",
    "Struct:LayerNorm", "Struct:GroupNorm", "Struct:InstanceNorm", "Struct:RmsNorm", "Struct:PRelu",
})
"""Burn's HalfPrecisionAdapter default set (14 entries); BatchNorm is left out because its running
variance can underflow in F16."""


def half_precision_module_set(with_: Sequence[str] = (), without: Sequence[str] = ()) -> frozenset[str]:
    """Burn's default set, plus `with_`, minus `without` (names qualified as Burn does).

    `with_` is applied first, so `without` may remove what `with_` added. A `without` name not in
    the set is a `ValueError`, as Burn's ``without_module`` panics.
    """
    modules = set(DEFAULT_HALF_PRECISION_MODULES)
    modules.update(qualify(n) for n in with_)
    for n in without:
        key = qualify(n)
        if key not in modules:
            known = ", ".join(sorted(m.removeprefix("Struct:") for m in modules))
            raise ValueError(f"without: '{n}' ({key}) is not in the module set ({known})")
        modules.discard(key)
    return frozenset(modules)

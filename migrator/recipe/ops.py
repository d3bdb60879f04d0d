"""The recipe's `ops:` entries: one type whose members are the registered ops' entries (`migrator.ops`).

Each entry is a one-key mapping naming its op, like an adapter with options. What can be checked
without the source's shapes is checked by the op's options model (sizes and parts, dims forming a
permutation, `to` referring only to groups its pattern has); the shape checks run when the plan is
built (`migrator.transform.ops`, each op's `build`). Names: `from` is a regex that must match a whole
(post-remap) name; `to` is a replacement in remap syntax ($1, ${name}) and `$i` is the part index
where an op has parts (split, unstack).

The union is made from the registry when a model holding it is built, so an op registered later
(one module defining `class MyOp(Op, name=...)`) is taken in: `recipe/model.py` rebuilds `Recipe`
when one is.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, BeforeValidator, Discriminator, GetCoreSchemaHandler, Tag
from pydantic_core import CoreSchema

from ..ops.base import OPS, op_kind_and_spec, problem

__all__ = ["OpSpec", "op_kind_and_spec", "op_names"]


def op_names() -> tuple[str, ...]:
    """Every registered op's name, in the registry's order."""
    from .. import ops  # noqa: F401  importing the package registers its ops

    return tuple(OPS)


def _op_tag(value: object) -> str | None:
    if isinstance(value, BaseModel):
        return next(iter(type(value).model_fields))
    if isinstance(value, dict) and len(value) == 1:
        key = next(iter(value))
        return key if key in OPS else None
    return None


def _known_op(value: object) -> object:
    """An entry is a one-key mapping naming a known op: said so with the valid names, not a union dump."""
    if isinstance(value, BaseModel):
        return value
    names = op_names()
    valid = "ops: " + ", ".join(names)
    if not isinstance(value, dict) or len(value) != 1:
        keys = ", ".join(map(str, value)) if isinstance(value, dict) else None
        raise problem("an op entry has exactly one key, the op's name" + (f" (got {keys})" if keys else ""),
                      hint="e.g. {split: {from: ..., dim: 1, parts: 3, to: 'x.$i'}}; " + valid)
    name = next(iter(value))
    if name not in names:
        from ..naming.similarity import did_you_mean

        guess = did_you_mean(str(name), list(names))
        raise problem(f"unknown op '{name}'", hint=(f"did you mean '{guess}'? " if guess else "") + valid)
    return value


class OpSpec:
    """One `ops:` entry: `{OP: {options}}`, validated as the entry of the op it names."""

    @classmethod
    def annotation(cls) -> Any:
        """The tagged union of every registered op's entry, as pydantic validates it now (and as the
        loader walks an error's location through it: `model_types._unwrap`)."""
        members = tuple(Annotated[OPS[name].entry, Tag(name)] for name in op_names())
        union = Union[members] if len(members) > 1 else members[0]  # noqa: UP007  (a runtime tuple of members)
        return Annotated[union, Discriminator(_op_tag, custom_error_type="recipe_union",
                                              custom_error_message="expected an op"), BeforeValidator(_known_op)]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return handler(cls.annotation())

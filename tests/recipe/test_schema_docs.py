"""Issue 20 item 18: the recipe JSON Schema documents every property, and dtype and adapter names
are enums, so an editor completes and explains every key of a recipe.

The walk covers the whole schema: the root, every `$defs` model, nested properties, items,
additionalProperties and the members of anyOf / oneOf / allOf. A field added to migrator/recipe/model.py
without a description fails here, naming its path in the schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from migrator.recipe.loader import recipe_json_schema

SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

DTYPE_PROPERTIES = {"dtype", "cast"}
"""Properties whose strings are dtype names (and `to` inside FloatCastOptionsSpec, checked by path)."""
ADAPTER_PROPERTIES = {"adapters"}


def subschemas(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in `node`, with a readable path, itself first."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key in SUBSCHEMA_MAPS:
        for name, sub in (node.get(key) or {}).items():
            yield from subschemas(sub, f"{path}.{key}.{name}")
    for key in SUBSCHEMA_LISTS:
        for i, sub in enumerate(node.get(key) or []):
            yield from subschemas(sub, f"{path}.{key}[{i}]")
    for key in SUBSCHEMA_ONE:
        if isinstance(node.get(key), dict):
            yield from subschemas(node[key], f"{path}.{key}")


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def free_strings(schema: dict[str, Any], node: dict[str, Any], seen: frozenset[str] = frozenset()) -> list[str]:
    """The string-typed schemas reachable from `node` (through refs, unions and items, not through an
    object's own properties) that have no enum or const: values an editor cannot offer."""
    ref = node.get("$ref")
    if ref is not None:
        return [] if ref in seen else free_strings(schema, resolve(schema, node), seen | {ref})
    found = [] if node.get("type") != "string" or "enum" in node or "const" in node else [str(node)]
    for key in SUBSCHEMA_LISTS:
        for sub in node.get(key) or []:
            found += free_strings(schema, sub, seen)
    if isinstance(node.get("items"), dict):
        found += free_strings(schema, node["items"], seen)
    return found


def test_every_property_has_a_description() -> None:
    schema = recipe_json_schema()
    missing = [f"{path}.properties.{name}" for path, node in subschemas(schema, "$")
               for name, prop in (node.get("properties") or {}).items()
               if not (isinstance(prop, dict) and str(prop.get("description", "")).strip())]
    assert not missing, "properties without a description:\n  " + "\n  ".join(missing)
    assert sum(len(n.get("properties") or {}) for _, n in subschemas(schema, "$")) > 40  # the walk reaches the $defs


def test_dtype_and_adapter_names_are_enums() -> None:
    schema = recipe_json_schema()
    checked = []
    for path, node in subschemas(schema, "$"):
        for name, prop in (node.get("properties") or {}).items():
            is_dtype = name in DTYPE_PROPERTIES or (name == "to" and path.endswith("FloatCastOptionsSpec"))
            if is_dtype or name in ADAPTER_PROPERTIES:
                checked.append(f"{path}.{name}")
                assert not free_strings(schema, prop), f"{path}.properties.{name} takes free strings"
    assert {"$.dtype", "$.adapters", "$.$defs.CastSpec.cast",
            "$.$defs.FloatCastOptionsSpec.to"} <= set(checked)
    cast = schema["$defs"]["CastSpec"]["properties"]["cast"]["enum"]
    assert cast == ["F64", "F32", "Flex32", "F16", "BF16"]
    names = next(m["enum"] for m in schema["properties"]["adapters"]["items"]["oneOf"] if "enum" in m)
    assert set(names) == {"identity", "pytorch_to_burn", "burn_to_pytorch", "half_precision"}


def test_free_strings_catches_a_plain_string() -> None:
    # the checker itself: a plain string member is found, an enum member is not
    schema = {"$defs": {"A": {"type": "string"}}}
    assert free_strings(schema, {"oneOf": [{"enum": ["x"], "type": "string"}, {"$ref": "#/$defs/A"}]})
    assert not free_strings(schema, {"oneOf": [{"enum": ["x"], "type": "string"}]})

"""Recipe loading: every valid shape, and the exact error text (with LINE:COL) for bad recipes.

Golden strings are compared whole so that a change in wording or position is a visible decision.
"""

from __future__ import annotations

import hashlib
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from migrator.core.errors import MigratorError
from migrator.recipe.loader import (
    MAX_RECIPE_BYTES,
    SCHEMA_REGENERATE,
    LoadedRecipe,
    RecipeError,
    RecipeIssue,
    load_recipe,
    parse_recipe,
    recipe_json_schema,
    recipe_json_schema_text,
)
from migrator.recipe.model import CastSpec, FloatCastSpec, HalfPrecisionSpec, Recipe

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = ("valid adapters: identity, pytorch_to_burn, burn_to_pytorch, half_precision, "
            "{half_precision: {...}}, {float_cast: {to: DTYPE}}")
USE_FLOAT = "use one of F64, F32, Flex32, F16, BF16"
TARGET_KEYS = ("path, format, template, template_format, storage_options, template_storage_options, overwrite, fsync, "
               "metadata, clear_metadata, scalars, quantize, tokenizer, rope_scaling, hf_config, shard, copy, "
               "config, copy_from, optimizer, param_order")
TOP_KEYS = ("version, description, config, source, sources, remap, filter, modules, ops, add_tokens, adapters, dtype, "
            "quantize, target, allow_partial, validate, training_state, executor")


def write(folder: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


@pytest.fixture
def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write `text` as ./recipe.yaml and load it by that relative name (as a user would)."""
    monkeypatch.chdir(tmp_path)

    def _load(text: str) -> LoadedRecipe:
        write(tmp_path, text)
        return load_recipe("recipe.yaml")

    return _load


@pytest.fixture
def errors(load):
    """The RecipeError text for `text` (which must be invalid)."""

    def _errors(text: str) -> str:
        with pytest.raises(RecipeError) as info:
            load(text)
        return str(info.value)

    return _errors


# ---------------------------------------------------------------------------------------------
# Valid recipes
# ---------------------------------------------------------------------------------------------

FULL = r"""
# yaml-language-server: $schema=../schemas/recipe.schema.json
version: 1
description: every key the issue shows
source:
  path: weights/model.pt
  format: auto
  top_level_key: state_dict
  contiguous_indices: true
  skip_enum_variants: false
remap:
  - from: '^model\.'
    to: ''
  - from: '^transformer\.h\.(\d+)\.'
    to: 'transformer.layer$1.'
  - from: '^(?P<block>\w+)\.w$'
    to: '\g<block>.weight'
    syntax: python
filter:
  include: [{regex: '^encoder\.'}, {path: decoder.scale}, {predicate: 'pkg.module:func'}]
  exclude: [{regex: '\.num_batches_tracked$'}]
modules:
  Linear: ['\.(query|key|value)$']
  BatchNorm: ['\.bn\d+$']
adapters: [pytorch_to_burn]
dtype: keep
target:
  path: out/model.bpk
  format: auto
  template: init.bpk
  template_format: burnpack
  overwrite: false
  metadata: {description: my model}
  clear_metadata: false
  scalars: keep
allow_partial: false
validate: true
"""


def test_full_recipe_loads_with_every_key(load, tmp_path: Path) -> None:
    loaded = load(FULL)
    r = loaded.recipe
    assert r.version == 1
    assert r.source.top_level_key == "state_dict"
    assert r.source.contiguous_indices is True and r.source.skip_enum_variants is False
    assert [(x.from_, x.to, x.syntax) for x in r.remap] == [
        (r"^model\.", "", "auto"),
        (r"^transformer\.h\.(\d+)\.", "transformer.layer$1.", "auto"),
        (r"^(?P<block>\w+)\.w$", r"\g<block>.weight", "python"),
    ]
    assert r.filter.include is not None
    assert [(c.regex, c.path, c.predicate) for c in r.filter.include] == [
        (r"^encoder\.", None, None), (None, "decoder.scale", None), (None, None, "pkg.module:func")]
    assert [c.regex for c in r.filter.exclude] == [r"\.num_batches_tracked$"]
    assert r.modules == {"Linear": [r"\.(query|key|value)$"], "BatchNorm": [r"\.bn\d+$"]}
    assert r.adapters == ["pytorch_to_burn"]
    assert r.dtype == "keep"
    assert r.target.metadata == {"description": "my model"}
    assert r.allow_partial is False and r.validate_shapes is True
    assert loaded.warnings == ()


def test_loaded_recipe_records_where_it_lives_and_its_hash(load, tmp_path: Path) -> None:
    loaded = load(FULL)
    raw = (tmp_path / "recipe.yaml").read_bytes()
    assert loaded.path == tmp_path / "recipe.yaml" and loaded.path.is_absolute()
    assert loaded.base_dir == tmp_path
    assert loaded.text == raw.decode()
    assert loaded.sha256 == hashlib.sha256(raw).hexdigest()
    assert loaded.source_path == tmp_path / "weights" / "model.pt"
    assert loaded.target_path == tmp_path / "out" / "model.bpk"
    assert loaded.template_path == tmp_path / "init.bpk"


def test_minimal_recipe_takes_the_defaults(load) -> None:
    r = load("version: 1\nsource: {path: a.safetensors}\ntarget: {path: b.bpk}\n").recipe
    assert r.remap == [] and r.filter.include is None and r.filter.exclude == [] and r.adapters == []
    assert r.dtype == "keep" and r.target.scalars == "keep" and r.target.template is None
    assert r.allow_partial is False and r.validate_shapes is True
    assert r.dump() == {"version": 1, "source": {"path": "a.safetensors"}, "target": {"path": "b.bpk"}}


def test_every_adapter_spelling(load) -> None:
    r = load("""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        adapters:
          - identity
          - pytorch_to_burn
          - burn_to_pytorch
          - half_precision
          - half_precision: {}
          - {half_precision: {with: [BatchNorm], without: [LayerNorm]}}
          - {float_cast: {to: F16}}
          - float_cast: {to: bf16}
    """).recipe
    assert r.adapters[:4] == ["identity", "pytorch_to_burn", "burn_to_pytorch", "half_precision"]
    assert isinstance(r.adapters[4], HalfPrecisionSpec) and r.adapters[4].half_precision.with_ == []
    assert isinstance(r.adapters[5], HalfPrecisionSpec)
    assert r.adapters[5].half_precision.with_ == ["BatchNorm"]
    assert r.adapters[5].half_precision.without == ["LayerNorm"]
    assert isinstance(r.adapters[6], FloatCastSpec) and r.adapters[6].float_cast.to == "F16"
    assert isinstance(r.adapters[7], FloatCastSpec) and r.adapters[7].float_cast.to == "bf16"


@pytest.mark.parametrize(("text", "expected"), [
    ("keep", "keep"),
    ("template", "template"),
    ("{cast: F16}", CastSpec(cast="F16")),
    ("{cast: BF16}", CastSpec(cast="BF16")),
    ("{cast: float32}", CastSpec(cast="float32")),
])
def test_dtype_policies(load, text: str, expected: object) -> None:
    assert load(f"version: 1\nsource: {{path: a}}\ntarget: {{path: b}}\ndtype: {text}\n").recipe.dtype == expected


def test_scalars_keep_none_and_declared(load) -> None:
    base = "version: 1\nsource: {path: a}\n"
    assert load(base + "target: {path: b, scalars: none}\n").recipe.target.scalars == "none"
    declared = load(base + """
target:
  path: b
  scalars:
    epoch: {int: -42}
    step: {uint: 18446744073709551615}
    loss: {float: 0.25}
    lr: {float: 1e-3}
    best: {bool: true}
""").recipe.target.scalars
    assert isinstance(declared, dict)
    assert declared["epoch"].int_ == -42
    assert declared["step"].uint == 2**64 - 1
    assert declared["loss"].float_ == 0.25
    assert declared["lr"].float_ == 0.001  # PyYAML reads 1e-3 as a string; pydantic parses it
    assert declared["best"].bool_ is True


def test_filters_with_regex_path_and_predicate(load) -> None:
    r = load("""
        version: 1
        source: {path: a}
        target: {path: b}
        filter:
          exclude:
            - regex: '^head\\.'
            - path: pooler.dense.bias
            - predicate: my_pkg.filters:is_frozen
    """).recipe
    assert r.filter.include is None
    assert [(c.regex, c.path, c.predicate) for c in r.filter.exclude] == [
        (r"^head\.", None, None), (None, "pooler.dense.bias", None), (None, None, "my_pkg.filters:is_frozen")]


@pytest.mark.parametrize(("text", "expected"), [
    ("model.state_dict", "model.state_dict"),
    ("[model, state_dict]", ["model", "state_dict"]),
    ("['a.b', c]", ["a.b", "c"]),
])
def test_top_level_key_as_string_or_list(load, text: str, expected: object) -> None:
    r = load(f"version: 1\nsource: {{path: a.pt, top_level_key: {text}}}\ntarget: {{path: b}}\n").recipe
    assert r.source.top_level_key == expected


def test_paths_resolve_from_the_recipe_folder_not_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = write(tmp_path / "project" / "recipes", """
        version: 1
        source: {path: ../weights/model.pt}
        target: {path: out/model.bpk, template: /abs/init.bpk}
    """)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_recipe(os.path.relpath(recipe, elsewhere))
    folder = tmp_path / "project" / "recipes"
    assert loaded.base_dir == folder
    assert loaded.path == recipe
    assert loaded.source_path == folder / ".." / "weights" / "model.pt"
    assert loaded.target_path == folder / "out" / "model.bpk"
    assert loaded.template_path == Path("/abs/init.bpk")


def test_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    loaded = load_recipe(write(tmp_path, "version: 1\nsource: {path: ~/w/a.pt}\ntarget: {path: b.bpk}\n"))
    assert loaded.source_path == tmp_path / "home" / "w" / "a.pt"
    assert loaded.template_path is None


def test_parse_recipe_in_memory(tmp_path: Path) -> None:
    text = "version: 1\nsource: {path: a.pt}\ntarget: {path: b.bpk}\n"
    loaded = parse_recipe(text, base_dir=tmp_path)
    assert loaded.base_dir == tmp_path and loaded.source_path == tmp_path / "a.pt"
    assert loaded.sha256 == hashlib.sha256(text.encode()).hexdigest()
    with pytest.raises(RecipeError) as info:
        parse_recipe("version: 1\nsource: {path: a.pt}\n", name="emitted.yaml")
    assert str(info.value) == ("emitted.yaml:1:1: target: missing required key 'target' "
                               "(hint: the file (or folder of shards) to write)")


def test_parse_recipe_defaults_to_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_recipe("version: 1\nsource: {path: a}\ntarget: {path: b}\n").target_path == tmp_path / "b"


def test_dump_round_trips_through_yaml(load) -> None:
    recipe = load(FULL).recipe
    again = parse_recipe(yaml.safe_dump(recipe.dump(), sort_keys=False)).recipe
    assert again == recipe


def test_anchors_and_merge_keys_are_fine(load) -> None:
    r = load("""
        version: 1
        source: &src {path: a.pt, format: pytorch}
        target:
          <<: *src
          path: b.bpk
          format: burnpack
        remap:
          - &rule {from: '^a\\.', to: ''}
          - *rule
    """).recipe
    assert r.target.path == Path("b.bpk") and r.target.format == "burnpack"
    assert len(r.remap) == 2


def test_rust_replacement_with_a_missing_group_is_an_error(errors) -> None:
    # issue 20 item 3: was a warning (Burn expands it to ''), and the run then failed on a name collision
    assert errors(r"""
        version: 1
        source: {path: a}
        target: {path: b}
        remap:
          - {from: '^l(\d+)\.', to: 'layer$1_x.'}
    """) == ("recipe.yaml:5:29: remap[0].to: $1_x: group '1_x' does not exist; the pattern has 1 group "
             "(hint: write ${1}_x for group 1 followed by '_x')")


def test_checked_in_recipes_are_valid() -> None:
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    if not recipes:
        pytest.skip("no recipes/*.yaml")
    for path in recipes:
        load_recipe(path)


# ---------------------------------------------------------------------------------------------
# Errors: exact text
# ---------------------------------------------------------------------------------------------


def test_misspelt_top_level_key(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        adapter: [identity]
    """) == (f"recipe.yaml:4:1: adapter: unknown key 'adapter' (hint: did you mean 'adapters'? valid keys: {TOP_KEYS})")


def test_misspelt_nested_key(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target:
          path: b.bpk
          overwite: true
    """) == (f"recipe.yaml:5:3: target.overwite: unknown key 'overwite' "
             f"(hint: did you mean 'overwrite'? valid keys: {TARGET_KEYS})")


def test_misspelt_required_key_is_one_problem(errors) -> None:
    assert errors("""
        version: 1
        source: {pth: a.pt}
        target: {path: b.bpk}
    """) == ("recipe.yaml:2:10: source.pth: unknown key 'pth' (hint: did you mean 'path'? valid keys: "
             "path, format, top_level_key, tag, param_order, contiguous_indices, skip_enum_variants, storage_options, "
                 "lora, seed)")


def test_wrong_type_bool(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        allow_partial: maybe
    """) == "recipe.yaml:4:16: allow_partial: expected true or false, got 'maybe'"


def test_wrong_type_remap_not_a_list(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        remap: {from: x}
    """) == "recipe.yaml:4:8: remap: expected a list, got a mapping (hint: start each entry with '- ')"


def test_wrong_type_string_expected(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target:
          path: b.bpk
          metadata: {version: 1.10, on: x}
    """) == ("recipe.yaml:5:23: target.metadata.version: expected a string, got 1.1 "
             "(hint: quote it to keep it as text: '1.10')\n"
             "recipe.yaml:5:29: target.metadata: keys must be strings, got true (hint: quote it: 'on')")


def test_invalid_regex_in_remap_shows_the_position(errors) -> None:
    assert errors(r"""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        remap:
          - from: '^layer\.(\d+\.'
            to: 'layers.$1.'
    """) == ("recipe.yaml:5:11: remap[0].from: invalid regex '^layer\\.(\\d+\\.' at position 8: "
             "missing ), unterminated group")


def test_invalid_regex_in_filter(errors) -> None:
    assert errors(r"""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        filter:
          include:
            - regex: 'enc[oder'
    """) == ("recipe.yaml:6:14: filter.include[0].regex: invalid regex 'enc[oder' at position 3: "
             "unterminated character class")


def test_invalid_regex_in_modules(errors) -> None:
    assert errors(r"""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        modules:
          Linear: ['\.dense$', 'a{2,1}']
    """) == ("recipe.yaml:5:24: modules.Linear[1]: invalid regex 'a{2,1}' at position 1: "
             "invalid repetition size: {2,1} (min repeat greater than max repeat)")


def test_constructs_no_linear_time_engine_runs_are_explained(errors) -> None:
    assert errors(r"""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        filter: {exclude: [{regex: 'x(?=y)'}]}
    """) == ("recipe.yaml:4:28: filter.exclude[0].regex: invalid regex 'x(?=y)' at position 1: (?=...) look-ahead "
             "needs look-around, which neither RE2 (migrator's linear-time regex engine) nor Burn's Rust regex has")


def test_invalid_python_replacement_points_at_to(errors) -> None:
    assert errors(r"""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        remap:
          - {from: 'a(b)', to: '\2'}
    """) == "recipe.yaml:5:24: remap[0].to: \\2: group 2 does not exist; the pattern has 1 group"


def test_missing_required_field_points_at_the_parent_mapping(errors) -> None:
    assert errors("""
        version: 1
        source:
          format: pytorch
        target: {path: b.bpk}
    """) == ("recipe.yaml:3:3: source.path: missing required key 'path' "
             "(hint: file to read, relative to the recipe's folder)")


def test_missing_version(errors) -> None:
    assert errors("""
        # a comment first
        source: {path: a.pt}
        target: {path: b.bpk}
    """) == "recipe.yaml:2:1: version: missing required key 'version' (hint: start the recipe with 'version: 1')"


def test_unknown_adapter_name(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        adapters: [pytorch_to_burm]
    """) == ("recipe.yaml:4:12: adapters[0]: unknown adapter 'pytorch_to_burm' "
             f"(hint: did you mean 'pytorch_to_burn'? {ADAPTERS})")


def test_unknown_adapter_shapes(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        adapters:
          - {half_precison: {}}
          - {float_cast: {to: F16}, half_precision: {}}
          - {}
          - 3
          - {half_precision: {wiht: [BatchNorm]}}
    """) == "\n".join([
        "recipe.yaml:5:6: adapters[0]: unknown adapter 'half_precison' "
        f"(hint: did you mean 'half_precision'? {ADAPTERS})",
        "recipe.yaml:6:5: adapters[1]: an adapter entry has exactly one key, the adapter's name (got float_cast, "
        f"half_precision) (hint: put each adapter in its own list entry; {ADAPTERS})",
        f"recipe.yaml:7:5: adapters[2]: empty adapter entry (hint: {ADAPTERS})",
        f"recipe.yaml:8:5: adapters[3]: expected an adapter name or {{name: options}}, got 3 (hint: {ADAPTERS})",
        "recipe.yaml:9:23: adapters[4].half_precision.wiht: unknown key 'wiht' "
        "(hint: did you mean 'with'? valid keys: with, without)",
    ])


def test_float_cast_to_a_non_float_dtype(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        adapters:
          - float_cast: {to: I32}
    """) == ("recipe.yaml:5:22: adapters[0].float_cast.to: float_cast target must be a float dtype, got I32 "
             f"(hint: {USE_FLOAT})")


def test_unknown_cast_dtype(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        dtype: {cast: F17}
    """) == f"recipe.yaml:4:15: dtype.cast: unknown dtype 'F17' (hint: did you mean 'F16'? {USE_FLOAT})"


def test_dtype_policy_that_is_no_member_of_the_union(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt, top_level_key: {a: b}}
        target: {path: b.bpk, scalars: kep}
        dtype: templat
    """) == "\n".join([
        "recipe.yaml:2:37: source.top_level_key: expected a string or a list of strings, got a mapping",
        "recipe.yaml:3:32: target.scalars: expected 'keep', 'none' or a mapping such as {epoch: {int: 42}}, "
        "got 'kep' (hint: did you mean 'keep'?)",
        "recipe.yaml:4:8: dtype: expected 'keep', 'template' or {cast: DTYPE}, got 'templat' "
        "(hint: did you mean 'template'?)",
    ])


def test_scalar_declarations(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target:
          path: b.bpk
          scalars:
            a: {int: 1, float: 2.0}
            b: {int: true}
            c: {uint: -1}
            d: {int: 1.5}
    """) == "\n".join([
        "recipe.yaml:6:8: target.scalars.a: give exactly one of int, uint, float, bool (hint: e.g. {int: 42})",
        "recipe.yaml:7:14: target.scalars.b.int: expected a number, got true",
        "recipe.yaml:8:15: target.scalars.c.uint: uint must be in [0, 2**64)",
        "recipe.yaml:9:14: target.scalars.d.int: expected an integer, got 1.5",
    ])


@pytest.mark.parametrize("version", ["2", "true", "'1'"])
def test_unsupported_version(errors, version: str) -> None:
    shown = {"2": "2", "true": "true", "'1'": "'1'"}[version]
    assert errors(f"version: {version}\nsource: {{path: a}}\ntarget: {{path: b}}\n") == (
        f"recipe.yaml:1:10: version: unsupported recipe version {shown} "
        "(hint: this migrator reads version 1: write 'version: 1')")


def test_duplicate_key(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target:
          path: b.bpk
          overwrite: false
          overwrite: true
    """) == ("recipe.yaml:6:3: target.overwrite: duplicate key 'overwrite' "
             "(hint: first given at line 5; YAML would silently keep the last)")


def test_duplicate_key_and_validation_errors_are_reported_together(errors) -> None:
    assert errors("""
        version: 1
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk, overwrite: maybe}
    """) == ("recipe.yaml:2:1: version: duplicate key 'version' "
             "(hint: first given at line 1; YAML would silently keep the last)\n"
             "recipe.yaml:4:34: target.overwrite: expected true or false, got 'maybe'")


def test_yaml_syntax_error(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt
        target: {path: b.bpk}
    """) == ("recipe.yaml:3:7: invalid YAML: expected ',' or '}', but got ':' "
             "(hint: while parsing a flow mapping at line 2, column 9)")


def test_tab_indentation(errors) -> None:
    assert errors("version: 1\nsource:\n\tpath: a\n") == (
        "recipe.yaml:3:1: invalid YAML: found character '\\t' that cannot start any token "
        "(hint: indent with spaces; YAML does not allow tabs there)")


@pytest.mark.parametrize(("text", "expected"), [
    ("- version: 1\n", "recipe.yaml:1:1: the top level must be a mapping, got a list"),
    ("just words\n", "recipe.yaml:1:1: the top level must be a mapping, got a scalar ('just words')"),
])
def test_non_mapping_top_level(errors, text: str, expected: str) -> None:
    assert errors(text) == expected + " (hint: a recipe is a mapping: version: 1, source: {...}, target: {...})"


def test_empty_file(errors) -> None:
    assert errors("# nothing yet\n") == (
        "recipe.yaml:1:1: the recipe is empty (hint: start with 'version: 1', then source: and target:)")


def test_criterion_with_two_keys(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        filter:
          include:
            - {regex: '^enc', path: dec.scale}
            - {}
    """) == ("recipe.yaml:6:7: filter.include[0]: give exactly one of regex, path, predicate (got regex, path) "
             "(hint: put each in its own list entry)\n"
             "recipe.yaml:7:7: filter.include[1]: give exactly one of regex, path, predicate (got none)")


@pytest.mark.parametrize("predicate", ["no_colon", "pkg.mod:", ":func", "a:b:c", "pkg mod:func", "pkg.:f"])
def test_predicate_not_an_import_path(errors, predicate: str) -> None:
    assert errors(f"""
        version: 1
        source: {{path: a.pt}}
        target: {{path: b.bpk}}
        filter: {{exclude: [{{predicate: '{predicate}'}}]}}
    """) == (f"recipe.yaml:4:32: filter.exclude[0].predicate: predicate '{predicate}' is not an import path "
             "(hint: write 'package.module:function')")


def test_source_and_target_are_the_same_file(errors) -> None:
    assert errors("""
        version: 1
        source: {path: weights/model.bpk}
        target: {path: ./weights/../weights/model.bpk, overwrite: true}
    """) == ("recipe.yaml:3:16: target.path: the target is the same file as source.path "
             "(hint: write the output to a new file)")


def test_extensionless_target_gets_bpk_and_can_hit_the_source(errors) -> None:
    assert errors("""
        version: 1
        source: {path: model.bpk}
        target: {path: model}
    """) == ("recipe.yaml:3:16: target.path: the target is the same file as source.path "
             "(hint: write the output to a new file)")


def test_target_is_the_template(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target:
          path: out/model.bpk
          template: out/model.bpk
    """) == ("recipe.yaml:4:9: target.path: the target is the same file as target.template "
             "(hint: write the output to a new file)")


def test_several_errors_are_all_reported_in_file_order(errors) -> None:
    assert errors(r"""
        version: 1
        sorce: {path: a.pt}
        remap:
          - {from: '(', to: x}
        adapters: [identity, fancy]
        dtype: {cast: I8}
        target:
          path: b.bpk
          overwrite: 2
        validate: nope
    """) == "\n".join([
        f"recipe.yaml:2:1: sorce: unknown key 'sorce' (hint: did you mean 'source'? valid keys: {TOP_KEYS})",
        "recipe.yaml:4:12: remap[0].from: invalid regex '(' at position 0: missing ), unterminated group",
        f"recipe.yaml:5:22: adapters[1]: unknown adapter 'fancy' (hint: {ADAPTERS})",
        f"recipe.yaml:6:15: dtype.cast: dtype cast must be a float dtype, got I8 (hint: {USE_FLOAT})",
        "recipe.yaml:9:14: target.overwrite: expected true or false, got 2",
        "recipe.yaml:10:11: validate: expected true or false, got 'nope'",
    ])


def test_python_tags_are_refused(errors) -> None:
    assert errors("""
        version: 1
        source: !!python/object/apply:os.system ['echo hi']
        target: {path: b}
    """) == ("recipe.yaml:2:9: invalid YAML: could not determine a constructor for the tag "
             "'tag:yaml.org,2002:python/object/apply:os.system'")


def test_billion_laughs_is_bounded(errors) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = "\n".join(lines) + "\n"
    message = errors(text)
    assert message == ("recipe.yaml:5:5: the recipe expands to more than 100,000 YAML nodes "
                       "(hint: aliases (*name) repeat what they point to; a recipe is small)")


def test_recursive_alias_is_refused(errors) -> None:
    assert errors("version: 1\nsource: &s {path: a, more: *s}\n") == (
        "recipe.yaml:2:9: an alias refers to a node that contains it (recursive YAML)")


def test_file_size_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big.yaml").write_bytes(b"#" * (MAX_RECIPE_BYTES + 1))
    with pytest.raises(RecipeError) as info:
        load_recipe("big.yaml")
    assert str(info.value) == ("big.yaml: file is larger than 10 MiB "
                               "(hint: a recipe is a few KiB of YAML; is this the right file?)")


def test_not_utf8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_bytes(b"version: 1\ndescription: caf\xe9\n")
    with pytest.raises(RecipeError) as info:
        load_recipe("r.yaml")
    assert str(info.value) == "r.yaml:2:17: not UTF-8 text (byte 0xe9) (hint: save the recipe as UTF-8)"


def test_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError) as info:
        load_recipe("nope.yaml")
    assert str(info.value) == "nope.yaml: cannot read the recipe: No such file or directory"


def test_recipe_error_is_a_migrator_error_with_structured_issues(load) -> None:
    with pytest.raises(MigratorError) as info:
        load("version: 1\nsource: {path: a}\ntarget: {path: b, overwrite: maybe}\n")
    err = info.value
    assert isinstance(err, RecipeError)
    assert err.issues == [RecipeIssue("recipe.yaml", 3, 30, "target.overwrite",
                                      "expected true or false, got 'maybe'", None)]
    assert err.file == "recipe.yaml"


def test_model_validate_alone_still_gives_readable_messages() -> None:
    """Code that builds recipes without the loader (migrate convert) sees the same wording."""
    with pytest.raises(Exception, match=r"invalid regex '\(' at position 0: missing \), unterminated group"):
        Recipe.model_validate({"version": 1, "source": {"path": "a"}, "target": {"path": "b"},
                               "remap": [{"from": "(", "to": ""}]})


# ---------------------------------------------------------------------------------------------
# JSON Schema
# ---------------------------------------------------------------------------------------------


def test_schema_file_is_current() -> None:
    path = REPO / "schemas" / "recipe.schema.json"
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    assert current == recipe_json_schema_text(), (
        f"schemas/recipe.schema.json is stale (the recipe models changed); regenerate it with: {SCHEMA_REGENERATE}")


def test_schema_shape() -> None:
    schema = recipe_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "migrator recipe (version 1)"
    assert schema["required"] == ["version", "target"]  # and one of source, sources (a validator's rule)
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert "validate" in props and "validate_shapes" not in props  # YAML spellings
    assert "from" in schema["$defs"]["RemapSpec"]["properties"]
    assert list(schema) == list(recipe_json_schema())  # deterministic order


@pytest.mark.parametrize(("text", "expected"), [
    ("version: 1\n---\nversion: 1\n",
     "recipe.yaml:2:1: invalid YAML: a second document starts here (hint: a recipe is one YAML document)"),
    ("version: 1\nsource: &s {path: a}\ntarget: &s {path: b}\n",
     "recipe.yaml:3:9: invalid YAML: duplicate anchor 's' (hint: first defined at line 2, column 9)"),
    ("version: 1\ndescription: see: the docs\n",
     "recipe.yaml:2:17: invalid YAML: mapping values are not allowed here (hint: quote a value that contains ': ')"),
])
def test_other_yaml_errors(errors, text: str, expected: str) -> None:
    assert errors(text) == expected


def test_cast_to_a_float_burn_cannot_hold(errors) -> None:
    assert errors("""
        version: 1
        source: {path: a.pt}
        target: {path: b.bpk}
        dtype: {cast: F8_E4M3}
    """) == ("recipe.yaml:4:15: dtype.cast: dtype cast cannot be F8_E4M3: migrator casts to Burn's float dtypes "
             f"only (hint: {USE_FLOAT})")


def test_half_precision_without_unknown_module_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "hp.yaml"
    path.write_text("version: 1\nsource: {path: a.safetensors}\nadapters:\n  - half_precision:\n"
                    "      without: [LayerNorm, Batchnorm]\ntarget: {path: b.bpk}\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    text = str(e.value)
    assert "hp.yaml:5:" in text and "adapters[0].half_precision.without" in text and "'Batchnorm'" in text
    path.write_text(path.read_text().replace("Batchnorm", "GroupNorm"))
    assert load_recipe(path).recipe.adapters

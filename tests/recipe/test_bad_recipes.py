"""Bad recipes: every field given a wrong type, unknown keys, invalid regexes, missing files,
source == target, a template whose shapes disagree. Each is a clear error at the right line.

The sweeps work on one recipe that uses every field of the schema (checked against the models, so
a new field joins the sweep or fails `test_the_base_recipe_uses_every_field`). tests/recipe/test_recipe.py
holds the golden messages; here the point is coverage: no field is left whose bad value escapes as
an untyped exception or an error without a `recipe.yaml:LINE:COL`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from pydantic import BaseModel
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from migrator import from_numpy, save
from migrator.recipe.loader import RecipeError, load_recipe
from migrator.recipe.model import Recipe
from tests.support.cli import migrate_subprocess

BASE = r"""version: 1
description: every field
source:
  path: weights/model.pt
  format: auto
  top_level_key: state_dict
  tag: global_step7
  param_order: weights/order.pt
  contiguous_indices: true
  skip_enum_variants: false
  storage_options:
    endpoint_url: 'http://127.0.0.1:9000'
  lora:
    path: adapters/lora
    scale: 0.5
  seed: 7
remap:
  - from: '^model\.'
    to: ''
    syntax: rust
filter:
  include:
    - regex: '^encoder\.'
    - path: decoder.scale
    - predicate: 'pkg.module:func'
  exclude:
    - regex: '\.num_batches_tracked$'
modules:
  Linear:
    - '\.(query|key|value)$'
ops:
  - split:
      from: 'a\.(\d+)'
      dim: 1
      sizes:
        - 2
        - 2
      to:
        - 'b.$1'
        - 'c.$1'
      optional: true
  - split:
      from: 'd\.(\d+)'
      parts: 2
      to: 'd.$1.$i'
      optional: true
  - concat:
      from:
        - 'e\.(\d+)'
        - 'f.$1'
      dim: 0
      to: 'g.$1'
      optional: true
  - stack:
      from: 'h\.(\d+)\.(\d+)'
      over: 2
      dim: 0
      to: 'h.$1'
      optional: true
  - unstack:
      from: 'i\.(\d+)'
      dim: 0
      to: 'i.$1.$i'
      optional: true
  - reshape:
      from: 'j'
      shape:
        - -1
        - 4
      to: 'j2'
      optional: true
  - permute:
      from: 'k'
      dims:
        - 1
        - 0
      to: 'k2'
      optional: true
  - slice:
      from: 'l'
      dim: 0
      start: 0
      stop: 4
      to: 'l2'
      optional: true
  - rope_permute:
      from: 'm'
      heads: 2
      head_dim: 4
      inverse: true
      to: 'm2'
      optional: true
  - offset:
      from: 'm3'
      value: 1.0
      to: 'm4'
      dtype: F32
      optional: true
  - concat:
      from: 'n\.(\d+)'
      over: 1
      to: 'n'
  - linear:
      from:
        - 'a\.(.*)'
        - 'b.$1'
      weights:
        - 0.5
        - 0.5
      normalize: false
      to: 'o.$1'
      dtype: F32
      optional: true
  - scale:
      from: 'p'
      factor: 0.5
      to: 'p2'
      dtype: F16
      optional: true
  - slerp:
      from:
        - 'q\.(.*)'
        - 'r.$1'
      t: 0.3
      to: 'q2.$1'
      dtype: BF16
      optional: true
  - task_arithmetic:
      from:
        - 's\.(.*)'
        - 't.$1'
      weights:
        - 0.5
      density: 0.5
      lambda: 0.9
      normalize: true
      rescale: false
      seed: 3
      to: 's2.$1'
      dtype: F32
      optional: true
  - ties:
      from:
        - 'u\.(.*)'
        - 'v.$1'
      weights:
        - 1.0
      density: 0.5
      optional: true
  - dare_ties:
      from:
        - 'w\.(.*)'
        - 'x.$1'
      weights:
        - 1.0
      seed: 1
      optional: true
  - dare_linear:
      from:
        - 'y\.(.*)'
        - 'z.$1'
      weights:
        - 1.0
      seed: 1
      optional: true
  - lora_fold:
      from:
        - 'aa\.(.*)\.weight'
        - 'ab.$1.lora_A.weight'
        - 'ab.$1.lora_B.weight'
      scaling: 2.0
      form: transposed
      to: 'ac.$1'
      dtype: F16
      optional: true
adapters:
  - pytorch_to_burn
  - half_precision:
      with:
        - BatchNorm
      without:
        - Embedding
  - float_cast:
      to: BF16
dtype:
  cast: F16
add_tokens:
  tokens:
    - '<tool>'
  fill: zeros
quantize:
  scheme: FP8_BLOCK
  ignore:
    - 'lm_head$'
target:
  path: out/model.bpk
  format: safetensors
  template: init.bpk
  template_format: burnpack
  storage_options:
    profile: dev
  template_storage_options:
    anon: true
  overwrite: false
  fsync: true
  metadata:
    description: my model
  clear_metadata: false
  scalars:
    epoch:
      int: 42
    steps:
      uint: 7
    lr:
      float: 0.001
    best:
      bool: true
  quantize:
    '\.weight$': Q8_0
  tokenizer: tokenizer.model
  rope_scaling:
    rope_type: llama3
    factor: 8.0
    low_freq_factor: 1.0
    high_freq_factor: 4.0
    original_max_position_embeddings: 8192
  hf_config: false
  shard:
    max_size: 5GB
    name: model.safetensors
  copy:
    - config.json
    - path: 'tokenizer*'
      optional: true
  copy_from: weights/
  config: {}
  optimizer: out/model-optim.bpk
  param_order: weights/new-model.pt
allow_partial: false
training_state: drop
validate: true
executor:
  ray:
    address: auto
config: weights/config.json
"""

# BASE with `sources:` (a list) in place of `source:`, each entry using every field of its own
SOURCES = r"""sources:
  - path: weights/model.pt
    name: encoder
    format: auto
    top_level_key: state_dict
    tag: global_step7
    param_order: weights/order.pt
    contiguous_indices: true
    skip_enum_variants: false
    storage_options:
      profile: dev
    remap:
      - {from: '^model\.', to: ''}
    filter:
      include: [{regex: '^encoder\.'}]
    prefix: bert.
  - {path: weights/head.pt, name: head, lora: adapters/head, seed: 3}
"""
BASE_SOURCES = BASE[:BASE.index("source:")] + SOURCES + BASE[BASE.index("remap:"):].replace(
    "  tokens:\n    - '<tool>'\n", "  file: new-tokens.txt\n")  # add_tokens takes one of the two

Path_ = tuple[Any, ...]


def load_text(folder: Path, text: str) -> Any:
    path = folder / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return load_recipe(path)


def nodes(node: Node, path: Path_ = ()) -> Iterator[tuple[Path_, Node | None, Node]]:
    """(path, key node or None for list items, value node) for every entry below `node`."""
    if isinstance(node, MappingNode):
        for k, v in node.value:
            key = yaml.safe_load(k.value) if k.tag.endswith(":int") else k.value
            yield (*path, key), k, v
            yield from nodes(v, (*path, key))
    elif isinstance(node, SequenceNode):
        for i, v in enumerate(node.value):
            yield (*path, i), None, v
            yield from nodes(v, (*path, i))


ROOT = yaml.compose(BASE)
ENTRIES = list(nodes(ROOT))


def render(path: Path_) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def replaced(key: Node | None, value: Node, new: str) -> str:
    """BASE with one entry's value replaced by `new` (flow style, on the key's line)."""
    if key is None:  # a list item: replace the item itself
        start, end = value.start_mark.index, value.end_mark.index
        old = BASE[start:end]
        return BASE[:start] + new + old[len(old.rstrip()):] + BASE[end:]
    start, end = key.end_mark.index, value.end_mark.index
    old = BASE[start:end]
    return BASE[:start] + ": " + new + old[len(old.rstrip()):] + BASE[end:]


def wrong_values(value: Node) -> list[str]:
    if isinstance(value, MappingNode):
        return ["[1, 2]", "7"]
    if isinstance(value, SequenceNode):
        return ["{x: 1}", "7"]
    return ["{x: 1}", "[1, 2]"]


def _op_sample(entries: list[tuple[Path_, Node | None, Node]]) -> list[tuple[Path_, Node | None, Node]]:
    """The ops: entries repeat one key (optional, from, to, dim) across ten ops of the same base
    type: each key (and node kind) under ops is swept at its first place only, to keep the suite fast."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for path, key, value in entries:
        if path[:1] == ("ops",) and len(path) >= 4:
            sig = (*path[3:], type(value).__name__)
            if sig in seen:
                continue
            seen.add(sig)
        out.append((path, key, value))
    return out


SWEEP = [(path, key, value, wrong) for path, key, value in _op_sample(ENTRIES) for wrong in wrong_values(value)]


def test_the_base_recipe_is_valid(tmp_path: Path) -> None:
    loaded = load_text(tmp_path, BASE)
    assert loaded.recipe.target.scalars["best"].bool_ is True


def _models_fields() -> set[tuple[str, str]]:
    """(model, YAML key) for every field of every model reachable from Recipe."""
    out: set[tuple[str, str]] = set()
    todo: list[Any] = [Recipe]
    seen: set[Any] = set()
    while todo:
        tp = todo.pop()
        if typing.get_origin(tp) is not None:
            todo.extend(a for a in typing.get_args(tp) if not isinstance(a, str | int))
            continue
        if not (isinstance(tp, type) and issubclass(tp, BaseModel)) or tp in seen:
            continue
        seen.add(tp)
        for name, f in tp.model_fields.items():
            out.add((tp.__name__, f.alias or name))
            todo.append(f.annotation)
    return out


def _covered(tp: Any, data: Any, out: set[tuple[str, str]]) -> None:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        _covered(typing.get_args(tp)[0], data, out)
    elif origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for member in typing.get_args(tp):
            _covered(member, data, out)
    elif origin is list and isinstance(data, list):
        for item in data:
            _covered(typing.get_args(tp)[0], item, out)
    elif origin is dict and isinstance(data, dict):
        for item in data.values():
            _covered(typing.get_args(tp)[1], item, out)
    elif isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(data, dict):
        keys = {f.alias or n: f for n, f in tp.model_fields.items()}
        if not set(data) <= set(keys):
            return  # another member of a union
        for k, v in data.items():
            out.add((tp.__name__, k))
            _covered(keys[k].annotation, v, out)


def test_the_base_recipe_uses_every_field(tmp_path: Path) -> None:
    covered: set[tuple[str, str]] = set()
    _covered(Recipe, yaml.safe_load(BASE), covered)
    _covered(Recipe, yaml.safe_load(BASE_SOURCES), covered)
    assert load_text(tmp_path, BASE_SOURCES).recipe.sources[1].label == "head"
    assert _models_fields() - covered == set()


@pytest.mark.parametrize(("path", "key", "value", "wrong"), SWEEP,
                         ids=[f"{render(p)}={w}" for p, _, _, w in SWEEP])
def test_every_field_with_a_wrong_type_is_an_error_at_its_line(tmp_path: Path, path: Path_, key: Node | None,
                                                               value: Node, wrong: str) -> None:
    text = replaced(key, value, wrong)
    line = (key or value).start_mark.line + 1
    assert text.splitlines()[line - 1].rstrip().endswith(wrong)  # the edit is where we think
    with pytest.raises(RecipeError) as e:
        load_text(tmp_path, text)
    message = str(e.value)
    assert f"recipe.yaml:{line}:" in message, f"{render(path)} = {wrong} is not reported at line {line}:\n{message}"
    hit = next(i for i in e.value.issues if i.line == line)
    assert hit.col >= 1 and hit.message
    assert hit.loc.startswith(render(path).split("[")[0].split(".")[0]), hit


# ----------------------------------------------------------------------------------------------
# unknown keys, at every level that is a model (user mappings -- metadata, modules, scalar names,
# quantize regexes, config.json edits -- take any key)

MODEL_MAPPINGS = [p for p, _, v in [((), None, ROOT), *ENTRIES] if isinstance(v, MappingNode)
                  and p not in (("modules",), ("target", "metadata"), ("target", "scalars"), ("target", "quantize"),
                                ("source", "storage_options"), ("target", "storage_options"),
                                ("target", "template_storage_options"), ("target", "config"))]


def _node_at(path: Path_) -> Node:
    return next(v for p, _, v in [((), None, ROOT), *ENTRIES] if p == path)


@pytest.mark.parametrize("path", MODEL_MAPPINGS, ids=[render(p) or "<top>" for p in MODEL_MAPPINGS])
def test_unknown_key_at_every_level(tmp_path: Path, path: Path_) -> None:
    node = _node_at(path)
    at, col = node.start_mark.index, node.start_mark.column
    text = BASE[:at] + "colour: red\n" + " " * col + BASE[at:]
    with pytest.raises(RecipeError) as e:
        load_text(tmp_path, text)
    line = node.start_mark.line + 1
    assert f"recipe.yaml:{line}:{col + 1}:" in str(e.value) and "colour" in str(e.value), str(e.value)
    issue = next(i for i in e.value.issues if i.line == line)
    assert "unknown key 'colour'" in issue.message or "(got colour, " in issue.message, issue
    assert issue.hint, issue


def test_misspelt_keys_get_a_suggestion(tmp_path: Path) -> None:
    text = BASE.replace("  top_level_key:", "  top_level_kee:").replace("  overwrite:", "  overwrit:")
    with pytest.raises(RecipeError) as e:
        load_text(tmp_path, text)
    assert "did you mean 'top_level_key'" in str(e.value) and "did you mean 'overwrite'" in str(e.value)


# ----------------------------------------------------------------------------------------------
# invalid regexes, in every place a regex goes

REGEX_PLACES = [p for p, _, v in _op_sample(ENTRIES) if isinstance(v, ScalarNode) and (
    p[-1] in ("from", "regex") or (len(p) == 3 and p[0] == "modules"))]
BAD_REGEXES = ["(", "[z-a]", "*a", "a{2,1}", "(?P<n>a)(?P<n>b)", r"\p{Nope}", r"(a)\1", "a(?=b)", "a{1001}",
               "[[:alpha:]&&[a-c]]",
               "(?<=a+)b", "\\"]


def test_regex_places_are_all_found() -> None:
    assert {render(p) for p in REGEX_PLACES} == {"remap[0].from", "filter.include[0].regex",
                                                 "filter.exclude[0].regex", "modules.Linear[0]",
                                                 "ops[0].split.from"}


@pytest.mark.parametrize("pattern", BAD_REGEXES)
@pytest.mark.parametrize("path", REGEX_PLACES, ids=[render(p) for p in REGEX_PLACES])
def test_invalid_regex_is_an_error_at_its_line(tmp_path: Path, path: Path_, pattern: str) -> None:
    key, value = next((k, v) for p, k, v in ENTRIES if p == path)
    quoted = "'" + pattern.replace("'", "''") + "'"
    with pytest.raises(RecipeError) as e:
        load_text(tmp_path, replaced(key, value, quoted))
    line = (key or value).start_mark.line + 1
    issue = next(i for i in e.value.issues if i.line == line)
    assert "regex" in issue.message, issue


@pytest.mark.parametrize("to", [r"\g<9>", r"\9", r"\g<nope>", r"$1\1"])
def test_invalid_replacement_points_at_to(tmp_path: Path, to: str) -> None:
    text = BASE.replace("    to: ''", "    to: '" + to + "'").replace("    syntax: rust", "    syntax: auto")
    with pytest.raises(RecipeError) as e:
        load_text(tmp_path, text)
    line = next(n for n, text_line in enumerate(text.splitlines(), 1) if text_line == "    to: '" + to + "'")
    assert f"recipe.yaml:{line}:" in str(e.value) and "remap[0].to" in str(e.value), str(e.value)


# ----------------------------------------------------------------------------------------------
# values of the right type that are still wrong (each at its line)

WRONG_VALUES = {  # old text -> new text; the error is at the line where the old text starts
    "source.format": ("  format: auto\n  top_level_key", "  format: onnx\n  top_level_key"),
    "dtype.cast": ("  cast: F16", "  cast: I8"),
    "float_cast.to": ("      to: BF16", "      to: F8_E4M3"),
    "half_precision.without": ("        - Embedding", "        - Embeding"),
    "scalars.uint": ("      uint: 7", "      uint: -7"),
    "scalars.int": ("      int: 42", "      int: 9223372036854775808"),
    "empty path": ("  path: out/model.bpk", "  path: ''"),
    "NUL in a path": ("  path: out/model.bpk", '  path: "out/\\0.bpk"'),
    "lone surrogate": ("description: every field", 'description: "\\ud800"'),
    "version 2": ("version: 1", "version: 2"),
    "predicate": ("    - predicate: 'pkg.module:func'", "    - predicate: 'pkg module'"),
    "two criteria in one entry": ("    - path: decoder.scale", "    - path: decoder.scale\n      regex: x"),
    "syntax": ("    syntax: rust", "    syntax: perl"),
    "scalars keyword": ("  scalars:\n    epoch:\n      int: 42\n    steps:\n      uint: 7\n    lr:\n"
                        "      float: 0.001\n    best:\n      bool: true\n", "  scalars: all\n"),
}


@pytest.mark.parametrize("case", list(WRONG_VALUES))
def test_wrong_values_are_errors_at_their_line(tmp_path: Path, case: str) -> None:
    old, new = WRONG_VALUES[case]
    assert BASE.count(old) == 1, case
    line = BASE[: BASE.index(old)].count("\n") + 1
    with pytest.raises(RecipeError) as e:
        load_text(tmp_path, BASE.replace(old, new))
    assert any(i.line == line for i in e.value.issues), str(e.value)
    assert "Traceback" not in str(e.value)


def test_unprintable_and_non_utf8_recipes(tmp_path: Path) -> None:
    for raw, where in ((b"version: 1\x00\n", "recipe.yaml:1:11:"),
                       (b"version: 1\ndescription: \xff\n", "recipe.yaml:2:14:"),
                       (b"version: 1\ndescription: a\x07b\n", "recipe.yaml:2:15:")):
        path = tmp_path / "recipe.yaml"
        path.write_bytes(raw)
        with pytest.raises(RecipeError) as e:
            load_recipe(path)
        assert where in str(e.value), str(e.value)


# ----------------------------------------------------------------------------------------------
# through the command line: missing files, source == target, a template that disagrees


def migrate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return migrate_subprocess(*args, cwd=cwd, timeout=120)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    save([from_numpy("w", np.arange(6, dtype=np.float32).reshape(2, 3)),
          from_numpy("b", np.ones(3, np.float32))], tmp_path / "src.safetensors")
    save([from_numpy("w", np.zeros((3, 2), np.float32)), from_numpy("b", np.zeros(3, np.float32))],
         tmp_path / "tpl.bpk")
    return tmp_path


def recipe(folder: Path, body: str) -> str:
    (folder / "r.yaml").write_text(textwrap.dedent(body).lstrip())
    return "r.yaml"


def assert_clean_failure(out: subprocess.CompletedProcess[str], code: int, *needles: str,
                         in_report: bool = False) -> None:
    """`in_report`: the needles may be in the report's summary on stdout (its errors are not repeated)."""
    assert out.returncode == code, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    text = out.stdout + out.stderr if in_report else out.stderr
    for n in needles:
        assert n in text, (n, text)


@pytest.mark.parametrize("command", ["run", "plan", "validate"])
def test_missing_source_and_template(files: Path, command: str) -> None:
    r = recipe(files, "version: 1\nsource: {path: nope.safetensors}\ntarget: {path: out.bpk}\n")
    assert_clean_failure(migrate(command, r, cwd=files), 1, str(files / "nope.safetensors"), "No such file")
    r = recipe(files, "version: 1\nsource: {path: src.safetensors}\ntarget: {path: out.bpk, template: nope.bpk}\n")
    assert_clean_failure(migrate(command, r, cwd=files), 1, str(files / "nope.bpk"), "No such file")
    assert not (files / "out.bpk").exists()


def test_missing_recipe_file(files: Path) -> None:
    assert_clean_failure(migrate("run", "absent.yaml", cwd=files), 2, "absent.yaml", "cannot read the recipe")


def test_a_folder_as_source(files: Path) -> None:
    (files / "dir.safetensors").mkdir()
    r = recipe(files, "version: 1\nsource: {path: dir.safetensors}\ntarget: {path: out.bpk}\n")
    assert_clean_failure(migrate("run", r, cwd=files), 1, str(files / "dir.safetensors"))


@pytest.mark.parametrize("target", ["src.safetensors", "./src.safetensors", "sub/../src.safetensors",
                                    "link.safetensors"])
def test_source_equal_to_target_is_refused_at_its_line(files: Path, target: str) -> None:
    (files / "sub").mkdir()
    (files / "link.safetensors").symlink_to(files / "src.safetensors")
    before = (files / "src.safetensors").read_bytes()
    r = recipe(files, f"version: 1\nsource: {{path: src.safetensors}}\ntarget:\n  path: {target}\n"
                      "  overwrite: true\n")
    out = migrate("run", r, cwd=files)
    assert_clean_failure(out, 2, "r.yaml:4:9:", "target.path", "same file as source.path")
    assert (files / "src.safetensors").read_bytes() == before


def test_hard_link_of_the_source_as_target_is_refused(files: Path) -> None:
    os.link(files / "src.safetensors", files / "hard.safetensors")
    r = recipe(files, "version: 1\nsource: {path: src.safetensors}\n"
                      "target: {path: hard.safetensors, overwrite: true}\n")
    assert_clean_failure(migrate("run", r, cwd=files), 2, "r.yaml:3:", "same file as source.path")


def test_template_whose_shapes_disagree(files: Path) -> None:
    r = recipe(files, "version: 1\nsource: {path: src.safetensors}\ntarget: {path: out.bpk, template: tpl.bpk}\n")
    out = migrate("run", r, cwd=files)
    assert_clean_failure(out, 1, "Shape mismatch for 'w'", "[3, 2]", "[2, 3]", "nothing written", in_report=True)
    assert not (files / "out.bpk").exists()
    # validate: false keeps the template's value for the mismatched tensor, as Burn does without validation
    r = recipe(files, "version: 1\nsource: {path: src.safetensors}\ntarget: {path: out.bpk, template: tpl.bpk}\n"
                      "validate: false\n")
    out = migrate("run", r, cwd=files)
    assert out.returncode == 0, out.stderr
    # a template that is the target is refused at the recipe's line
    r = recipe(files, "version: 1\nsource: {path: src.safetensors}\ntarget: {path: tpl.bpk, template: tpl.bpk, "
                      "overwrite: true}\n")
    assert_clean_failure(migrate("run", r, cwd=files), 2, "r.yaml:3:", "same file as target.template")


def test_template_dtype_policy_that_cannot_apply(files: Path) -> None:
    save([from_numpy("w", np.zeros((2, 3), np.int32)), from_numpy("b", np.zeros(3, np.float32))],
         files / "tpl-int.bpk")
    r = recipe(files, "version: 1\nsource: {path: src.safetensors}\ndtype: template\n"
                      "target: {path: out.bpk, template: tpl-int.bpk}\n")
    assert_clean_failure(migrate("run", r, cwd=files), 1, "'w'", "nothing written", in_report=True)
    r = recipe(files, "version: 1\nsource: {path: src.safetensors}\ndtype: template\ntarget: {path: out.bpk}\n")
    assert_clean_failure(migrate("run", r, cwd=files), 1, "dtype: template needs target.template")


def test_a_target_format_that_cannot_be_told(files: Path) -> None:
    r = recipe(files, "version: 1\nsource: {path: src.safetensors}\ntarget: {path: out.onnx}\n")
    assert_clean_failure(migrate("run", r, cwd=files), 1, "out.onnx", "extension")


def test_predicates_are_code_imported_at_plan_time_never_at_load(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SECURITY.md: loading or validating the *shape* of a recipe imports nothing; planning imports
    and calls `filter.predicate` functions, so a recipe with predicates must be trusted like code."""
    sentinel = files / "imported"
    (files / "recipe_predicate_mod.py").write_text(f"open({str(sentinel)!r}, 'w').close()\n"
                                                   "def keep(name):\n    return True\n")
    r = recipe(files, "version: 1\nsource: {path: src.safetensors}\n"
                      "filter: {include: [{predicate: 'recipe_predicate_mod:keep'}]}\ntarget: {path: out.bpk}\n")
    monkeypatch.syspath_prepend(str(files))
    load_recipe(files / r)
    assert not sentinel.exists() and "recipe_predicate_mod" not in sys.modules
    out = subprocess.run([sys.executable, "-m", "migrator.cli", "plan", r], cwd=files, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(files)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sentinel.exists()

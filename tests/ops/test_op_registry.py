"""Every registered op (migrator/ops) has what a user meets it through: an entry in the checked-in
recipe schema, a section in docs/ops.md (written from the registry, and current), an example that is
a valid `ops:` entry, and a bad-recipe case here whose message is placed at its recipe line. A new op
without one of them fails here, naming it.

The expected messages are those main gave before the ops became units (issue 42): the wording and
`recipe.yaml:LINE:COL` of each must not move."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from migrator.ops import OPS, Op
from migrator.ops.reference import BEGIN, END, replaced
from migrator.recipe.loader import RecipeError, load_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPE = "version: 1\nsource: {path: in.safetensors}\ntarget: {path: out.safetensors}\nops:\n  - %s\n"

BAD = {
    "split": ("{split: {from: 'w', dim: 0, to: 'w.$i'}}",
              "recipe.yaml:5:13: ops[0].split: give exactly one of sizes, parts (hint: sizes: [768, 768, 768] or "
              "parts: 3)"),
    "concat": (r"{concat: {from: 'w\.(\d+)', to: 'w'}}",
               "recipe.yaml:5:21: ops[0].concat.from: one `from` regex needs `over`: the group holding each input's "
               "index (hint: or list the inputs: from: [REGEX, NAME, ...])"),
    "stack": (r"{stack: {from: 'w\.(\d+)', over: 2, to: 'w'}}",
              "recipe.yaml:5:38: ops[0].stack.over: over: group 2 does not exist; the pattern has 1 group"),
    "unstack": ("{unstack: {from: 'w', to: 'w.part'}}",
                "recipe.yaml:5:31: ops[0].unstack.to: to must use $i: every output would get the same name (hint: "
                "e.g. 'layers.$1.experts.$i.w1.weight')"),
    "reshape": ("{reshape: {from: 'w', shape: [-1, -1]}}",
                "recipe.yaml:5:34: ops[0].reshape.shape: shape [-1, -1]: lengths are >= 0, with at most one -1"),
    "permute": ("{permute: {from: 'w', dims: [0, 0]}}",
                "recipe.yaml:5:33: ops[0].permute.dims: dims [0, 0] is not a permutation of 0..1"),
    "slice": ("{slice: {from: 'w', start: true}}",
              "recipe.yaml:5:32: ops[0].slice.start: expected a number, got true"),
    "rope_permute": ("{rope_permute: {from: 'w', heads: 4, head_dim: 3}}",
                     "recipe.yaml:5:52: ops[0].rope_permute.head_dim: head_dim 3 must be even (rotary pairs) and at "
                     "least 2"),
    "offset": ("{offset: {from: 'w', value: 1.0, dtype: I32}}",
               "recipe.yaml:5:45: ops[0].offset.dtype: a computed tensor's dtype is a float dtype, got I32 (hint: "
               "use one of F64, F32, F16, BF16)"),
    "linear": (r"{linear: {from: ['a\.(.*)', 'b.$1'], weights: [1.0, -1.0]}}",
               "recipe.yaml:5:51: ops[0].linear.weights: the weights sum to 0: normalize divides by their sum, which "
               "would make every merged value inf or NaN (hint: give weights with a non-zero sum, or set normalize: "
               "false)"),
    "scale": ("{scale: {from: 'w', factor: .inf}}",
              "recipe.yaml:5:33: ops[0].scale.factor: expected a finite number (at most 3.403e+38 in magnitude), got "
              "inf: it would make every merged value inf or NaN"),
    "slerp": (r"{slerp: {from: ['a\.(.*)'], t: 0.5}}",
              "recipe.yaml:5:20: ops[0].slerp.from: from lists 1 input; slerp takes 2"),
    "task_arithmetic": (r"{task_arithmetic: {from: ['base\.(.*)', 'a.$1'], weights: [1.0, 2.0]}}",
                        "recipe.yaml:5:63: ops[0].task_arithmetic.weights: weights has 2 entries for 1 models after "
                        "the base (hint: from lists the base first, then the models)"),
    "ties": (r"{ties: {from: ['base\.(.*)', 'a.$1', 'b.$1'], weights: [1, 1], density: [0.5]}}",
             "recipe.yaml:5:77: ops[0].ties.density: density has 1 entries for 2 models"),
    "dare_ties": (r"{dare_ties: {from: ['base\.(.*)'], weights: []}}",
                  "recipe.yaml:5:24: ops[0].dare_ties.from: from lists 1 input; task arithmetic takes at least 2"),
    "dare_linear": (r"{dare_linear: {from: ['base\.(.*)', 'a.$2'], weights: [1]}}",
                    "recipe.yaml:5:26: ops[0].dare_linear.from: $2: group 2 does not exist; the pattern has 1 group"),
    "lora_fold": ("{lora_fold: {from: ['w', 'a', 'b'], scaling: 1.0, form: dense}}",
                  "recipe.yaml:5:61: ops[0].lora_fold.form: expected 'linear', 'transposed' or 'conv', got 'dense'"),
    "gather": ("{gather: {from: 'w', keep: [2, 0, 2]}}",
               "recipe.yaml:5:32: ops[0].gather.keep: keep lists row 2 twice (hint: repeat rows with repeat, or "
               "append copies with add_rows fill: row)"),
    "add_rows": ("{add_rows: {from: 'w', count: 2, size: 9}}",
                 "recipe.yaml:5:16: ops[0].add_rows: give exactly one of count, size (hint: count: 3 adds three rows)"),
    "repeat": ("{repeat: {from: 'w', times: -1}}",
               "recipe.yaml:5:33: ops[0].repeat.times: times -1 is out of range (1 to 65536)"),
    "clone": ("{clone: {from: 'w', to: 'v.$i'}}",
              "recipe.yaml:5:29: ops[0].clone.to: 'v.$i' uses $i, but this op has no part index (hint: $i is the "
              "part number of split and unstack outputs)"),
    "new": ("{new: {from: 'w', to: 'r', shape: [4, -1]}}",
            "recipe.yaml:5:39: ops[0].new.shape: shape [4, -1]: lengths are >= 0"),
}
"""op -> (an `ops:` entry it refuses, the one-line error at its key's line and column)."""


def _load(tmp_path: Path, entry: str) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE % entry, encoding="utf-8")
    load_recipe(path)


def test_the_registry_holds_the_ops_in_their_order() -> None:
    assert list(OPS) == ["split", "concat", "stack", "unstack", "reshape", "permute", "slice", "rope_permute",
                         "offset", "linear", "scale", "slerp", "task_arithmetic", "ties", "dare_ties", "dare_linear",
                         "lora_fold", "gather", "add_rows", "repeat", "clone", "new"]


def test_every_op_has_a_schema_entry() -> None:
    schema = json.loads((REPO / "schemas" / "recipe.schema.json").read_text(encoding="utf-8"))
    members = [m["$ref"].rsplit("/", 1)[1] for m in schema["properties"]["ops"]["items"]["oneOf"]]
    missing = [name for name, op in OPS.items() if op.entry.__name__ not in members
               or list(schema["$defs"][op.entry.__name__]["properties"]) != [name]]
    assert not missing, f"ops with no entry in schemas/recipe.schema.json (run tools/gen_schema.py): {missing}"
    assert len(members) == len(OPS)


def test_every_op_has_a_docs_section_and_the_reference_is_current() -> None:
    doc = (REPO / "docs" / "ops.md").read_text(encoding="utf-8")
    reference = doc[doc.index(BEGIN):doc.index(END)]
    missing = [name for name in OPS if f"\n### `{name}`\n" not in reference]
    assert not missing, f"ops with no section in docs/ops.md: {missing}"
    assert replaced(doc) == doc, "docs/ops.md's reference of the ops is stale; run: python tools/gen_schema.py"


def test_every_op_has_a_bad_recipe_case() -> None:
    assert sorted(BAD) == sorted(OPS), "give each op a refused entry in BAD"


@pytest.mark.parametrize("name", sorted(OPS))
def test_each_example_is_a_valid_entry(tmp_path: Path, name: str) -> None:
    """The example shown in docs/ops.md validates as the op it is about."""
    _load(tmp_path, OPS[name].example)


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_bad_case_is_refused_at_its_line(tmp_path: Path, name: str) -> None:
    entry, message = BAD[name]
    with pytest.raises(RecipeError) as e:
        _load(tmp_path, entry)
    assert str(e.value).replace(f"{tmp_path}/", "") == message


def test_an_op_is_registered_once() -> None:
    with pytest.raises(ValueError, match="op 'split' is registered twice"):
        class Again(Op, name="split"):
            options = OPS["split"].options
            summary = example = "x"
    assert type(OPS["split"]).__name__ == "Split"


def test_an_op_without_its_summary_is_refused() -> None:
    with pytest.raises(TypeError, match=r"op 'nameless' .* has no summary"):
        class Nameless(Op, name="nameless"):
            options = OPS["split"].options
            example = "x"
    assert "nameless" not in OPS

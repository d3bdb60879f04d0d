"""Hostile YAML in recipes: scalars whose construction fails, and keys built to collide.

Every case must end as a `RecipeError` at the offending node's `recipe.yaml:LINE:COL` (exit 2
from the CLI, no traceback), and never make the loader do unbounded work."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, save
from migrator.recipe.loader import MAX_NONSTRING_KEYS, RecipeError, parse_recipe
from tests.support.alarm import alarm as bounded

HEAD = "version: 1\nsource: {path: src.safetensors}\n"


def with_metadata_value(value: str) -> str:
    """`value` as written at line 5, column 8 of the recipe."""
    return HEAD + "target:\n  metadata:\n    k: " + value + "\n  path: out.safetensors\n"


# (YAML scalar, words the message must hold): each a constructor PyYAML's SafeLoader runs
BAD_SCALARS = [
    ("1" + "0" * 5000, "invalid integer"),  # Python's int-from-text limit is 4300 digits
    ("0x" + "f" * 300, "larger than 256 bits"),  # within the text bound, still too large
    ("1" + ":1" * 300, "invalid integer"),  # sexagesimal: quadratic in its length if constructed
    ("-0b" + "1" * 390, "larger than 256 bits"),
    ("2001-02-30", "invalid date '2001-02-30'"),
    ("2001-13-01", "invalid date"),
    ("2001-02-03 25:00:00", "invalid date"),
    ("!!timestamp abc", "invalid date 'abc'"),
    ("!!float abc", "invalid number 'abc'"),
    ("!!float ''", "invalid number"),
    ("!!int abc", "invalid integer 'abc'"),
    ("!!int 0x", "invalid integer"),
    ("!!int ''", "invalid integer"),
    ("!!bool maybe", "invalid boolean 'maybe'"),
    ("!!binary 'QQ='", "base64"),
    ("!!binary 'é'", "base64"),
    ("!!set [1, 2]", "expected a mapping node"),
    ("{<<: 1}", "expected a mapping"),
    ("{<<: [1]}", "expected a mapping"),
    ("!!omap 1", "expected a sequence"),
    ("!!pairs [1]", "expected a mapping"),
]


@pytest.mark.parametrize(("value", "words"), BAD_SCALARS, ids=[v[:20] for v, _ in BAD_SCALARS])
def test_a_scalar_that_fails_construction_is_a_recipe_error(value: str, words: str) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe(with_metadata_value(value), "recipe.yaml")
    text = str(info.value)
    assert text.startswith("recipe.yaml:5:"), text
    assert words in text, text
    assert len(text) < 400, text  # the value is shortened, not echoed in full


def test_explicit_tags_and_plain_scalars_get_different_hints() -> None:
    with pytest.raises(RecipeError) as tagged:
        parse_recipe(with_metadata_value("!!float abc"), "recipe.yaml")
    assert str(tagged.value) == ("recipe.yaml:5:8: invalid number 'abc' "
                                 "(hint: remove the tag, or write a valid number)")
    with pytest.raises(RecipeError) as plain:
        parse_recipe(with_metadata_value("2001-02-30"), "recipe.yaml")
    assert str(plain.value) == ("recipe.yaml:5:8: invalid date '2001-02-30': day is out of range for month "
                                "(hint: quote it to keep it as text: '2001-02-30')")


def test_bad_scalars_in_keys_and_deep_in_lists_are_placed() -> None:
    text = HEAD + "target: {path: out.safetensors}\nadapters:\n  - identity\n  - !!int x\n"
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "recipe.yaml")
    assert str(info.value).startswith("recipe.yaml:6:5: invalid integer 'x'"), str(info.value)
    text = HEAD + "target:\n  path: out.safetensors\n  metadata: {2001-02-30: x}\n"
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "recipe.yaml")
    assert str(info.value).startswith("recipe.yaml:5:14: invalid date"), str(info.value)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    save([from_numpy("w", np.arange(6, dtype=np.float32))], tmp_path / "src.safetensors")
    return tmp_path


CLI_CASES = ["1" + "0" * 5000, "2001-02-30", "!!float abc", "!!int abc", "!!timestamp 2001-99"]


@pytest.mark.parametrize("command", ["validate", "run"])
def test_the_cli_exits_2_with_the_line_and_no_traceback(files: Path, command: str) -> None:
    for i, value in enumerate(CLI_CASES):
        (files / f"r{i}.yaml").write_text(with_metadata_value(value))
    # one interpreter for all cases keeps the test fast; each case is still a full `main()` run
    script = ("import sys; from migrator.cli import main\n"
              "codes = [main([sys.argv[1], f'r{i}.yaml']) for i in range(int(sys.argv[2]))]\n"
              "print(codes)\n")
    out = subprocess.run([sys.executable, "-c", script, command, str(len(CLI_CASES))], cwd=files,
                         capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stdout.strip() == str([2] * len(CLI_CASES)), (out.stdout, out.stderr)
    for i in range(len(CLI_CASES)):
        assert f"r{i}.yaml:5:8: invalid" in out.stderr, out.stderr
    assert not (files / "out.safetensors").exists()


# ----------------------------------------------------------------------------------------------
# keys whose hashes collide: multiples of 2**61-1 all hash to 0 in CPython

COLLIDING = [k * (2**61 - 1) for k in range(1, 3_001)]  # the report had 20k; the cap is what counts


@pytest.fixture
def alarm() -> Iterator[None]:
    """A safety net, not a timing assert: a quadratic regression fails the test instead of hanging it."""
    with bounded(30, "the loader took more than 30 s"):
        yield


def refused_at(text: str) -> str:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "recipe.yaml")
    assert len(info.value.issues) == 1, str(info.value)[:500]
    return str(info.value)


@pytest.mark.usefixtures("alarm")
def test_colliding_integer_metadata_keys_are_refused_before_a_dict_is_built() -> None:
    body = "".join(f"    {k}: x\n" for k in COLLIDING)
    text = HEAD + "target:\n  path: out.safetensors\n  metadata:\n" + body
    message = refused_at(text)
    assert message.startswith(f"recipe.yaml:{5 + MAX_NONSTRING_KEYS + 1}:5: keys must be strings, got "
                              f"{COLLIDING[MAX_NONSTRING_KEYS]}; the recipe has more than "), message


@pytest.mark.usefixtures("alarm")
def test_colliding_keys_in_hex_in_a_model_mapping_are_refused() -> None:
    body = "".join(f"  {hex(k)}: 1\n" for k in COLLIDING)
    message = refused_at(HEAD + "target: {path: out.safetensors}\nfilter:\n" + body)
    assert f"recipe.yaml:{4 + MAX_NONSTRING_KEYS + 1}:3: keys must be strings" in message, message


@pytest.mark.usefixtures("alarm")
def test_colliding_keys_spread_over_merged_mappings_count_together() -> None:
    """Each anchored mapping stays under the cap; the mapping merging them all would not."""
    per = MAX_NONSTRING_KEYS // 4
    anchors = "".join(
        f"a{i}: &a{i} {{{', '.join(f'{k}: x' for k in COLLIDING[i * per:(i + 1) * per])}}}\n" for i in range(200))
    merged = ", ".join(f"*a{i}" for i in range(200))
    text = HEAD + anchors + "target:\n  path: out.safetensors\n  metadata: {<<: [" + merged + "]}\n"
    message = refused_at(text)
    assert "keys must be strings" in message and "more than" in message, message


def test_a_few_nonstring_keys_still_get_the_usual_message() -> None:
    """Below the cap nothing changes: pydantic's error, placed at the key, with its hint."""
    body = "".join(f"    {k}: x\n" for k in COLLIDING[:3])
    with pytest.raises(RecipeError) as info:
        parse_recipe(HEAD + "target:\n  path: out.safetensors\n  metadata:\n" + body, "recipe.yaml")
    assert str(info.value).splitlines() == [
        f"recipe.yaml:{6 + i}:5: target.metadata: keys must be strings, got {k} (hint: quote it: '{k}')"
        for i, k in enumerate(COLLIDING[:3])]

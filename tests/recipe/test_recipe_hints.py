"""Hints for the two typos a new user makes first: a `--top-level-key` and a recipe's indentation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from migrator.cli import main
from migrator.recipe.loader import RecipeError, parse_recipe


def yaml_error(text: str) -> str:
    with pytest.raises(RecipeError) as e:
        parse_recipe(text, "recipe.yaml")
    return str(e.value)


@pytest.mark.parametrize(("text", "line", "want"), [
    ("version: 1\nsource:\n  path: a.pt\n format: auto\ntarget: {path: b.bpk}\n", 4, "starts at column 2"),
    ("version: 1\nsource: {path: a.pt}\ntarget: {path: b.bpk}\ninclude:\n  - a\n - b\n", 6, "starts at column 2"),
    ("version: 1\nsource: {path: a}\ntarget: {path: b}\nremap:\n  - from: a\n   to: b\n", 6, "starts at column 4"),
    ("version: 1\nsource:\n  path: a.pt\n    format: auto\ntarget: {path: b.bpk}\n", 4,
     "line 4 is indented deeper (column 5) than the key on line 3 (column 3)"),
    ("version: 1\n  source: {path: a.pt}\n", 2, "line 2 is indented deeper (column 3) than the key on line 1"),
    ("version: 1\nsource: {path: a}\ntarget: {path: b}\nremap:\n  - from: a\n      to: b\n", 6,
     "than the key on line 5 (column 5)"),
])
def test_indentation_errors_get_an_indentation_hint(text: str, line: int, want: str) -> None:
    message = yaml_error(text)
    assert message.startswith(f"recipe.yaml:{line}:") and "check the indentation" in message and want in message


def test_a_colon_inside_a_value_still_gets_the_quoting_hint() -> None:
    for text in ("version: 1\ndescription: see: the docs\n", "version: 1\nsource:\n  path: a: b\n"):
        message = yaml_error(text)
        assert "quote a value that contains ': '" in message and "indentation" not in message


@pytest.mark.parametrize(("key", "hint"), [("encodr", "encoder"), ("model.encodr", "model.encoder"),
                                           ("decoder", "encoder"), ("optimizer", None), ("zzz", None)])
def test_top_level_key_typos_get_did_you_mean(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str,
                                              hint: str | None) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"encoder.w": np.ones(2, np.float32), "model.encoder.w": np.ones(2, np.float32),
               "model.head.w": np.ones(2, np.float32)}, str(path))
    assert main(["inspect", str(path), "--top-level-key", key]) == 1
    err = capsys.readouterr().err
    assert "selects no tensor" in err
    if hint is None:
        assert "did you mean" not in err
    else:
        assert err.rstrip().endswith(f"did you mean '{hint}'?")

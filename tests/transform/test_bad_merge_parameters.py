"""Parameters that would make every merged value inf or NaN are refused before anything is written
(a NaN or inf weight, t, density or lambda; weights summing to zero under normalize; a LoRA scale or
lora_alpha that is not finite), with a one-line usage error; before, the run wrote NaN with exit 0.

Oracle for the good case: numpy's weighted mean of the inputs, read back with `safetensors`."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import migrate_in_process

st_numpy = pytest.importorskip("safetensors.numpy")


@pytest.fixture
def models(tmp_path: Path) -> Path:
    for name, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        st_numpy.save_file({"w": np.full((2, 2), value, np.float32)}, str(tmp_path / name / "model.safetensors"))
    (tmp_path / "out").mkdir()
    st_numpy.save_file({"old": np.zeros(1, np.float32)}, str(tmp_path / "out" / "model.safetensors"))
    return tmp_path


def linear(tmp_path: Path, wa: str, wb: str, extra: str = "") -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"merge_method: linear\nmodels:\n  - model: a\n    parameters: {{weight: {wa}}}\n"
                    f"  - model: b\n    parameters: {{weight: {wb}}}\n{extra}dtype: float32\n")
    return path


def refused(models: Path, config: Path, *words: str) -> None:
    before = (models / "out" / "model.safetensors").read_bytes()
    p = migrate_in_process("merge", str(config), str(models / "out"), "--overwrite", "--no-progress")
    err = p.stdout + p.stderr
    assert p.returncode == 2 and "Traceback" not in err, err
    assert err.strip().count("\n") == 0 and all(w in err for w in words), err
    assert (models / "out" / "model.safetensors").read_bytes() == before  # the existing target survives


@pytest.mark.parametrize(("wa", "wb", "words"), [
    ("1", "-1", ["sum to 0", "normalize: false"]),
    ("0", "0", ["sum to 0"]),
    (".nan", "1", ["'weight'", "nan"]),
    (".inf", "1", ["'weight'", "inf"]),
    ("-.inf", "1", ["'weight'", "-inf"]),
    ("1e308", "1", ["'weight'", "float32"]),
])
def test_linear_weights(models: Path, wa: str, wb: str, words: list[str]) -> None:
    refused(models, linear(models, wa, wb), *words)


def test_weights_summing_to_zero_without_normalize_are_a_plain_sum(models: Path) -> None:
    config = linear(models, "1", "-1", "parameters: {normalize: false}\n")
    p = migrate_in_process("merge", str(config), str(models / "new"), "--no-progress")
    assert p.returncode == 0, p.stderr
    got = st_numpy.load_file(str(models / "new" / "model.safetensors"))["w"]
    assert np.array_equal(got, np.full((2, 2), 1.0 * 1 + 2.0 * -1, np.float32))


@pytest.mark.parametrize("t", [".nan", ".inf"])
def test_slerp_t(models: Path, t: str) -> None:
    config = models / "s.yaml"
    config.write_text(f"merge_method: slerp\nbase_model: a\nmodels:\n  - model: a\n  - model: b\n"
                      f"parameters: {{t: {t}}}\ndtype: float32\n")
    refused(models, config, "'t'")


@pytest.mark.parametrize(("param", "value", "word"), [("density", "1.5", "from 0 to 1"), ("density", ".nan", "nan"),
                                                      ("lambda", ".inf", "'lambda'")])
def test_task_arithmetic_parameters(models: Path, param: str, value: str, word: str) -> None:
    config = models / "t.yaml"
    where = (f"    parameters: {{weight: 1, {param}: {value}}}\n" if param == "density"
             else "    parameters: {weight: 1}\n")
    shared = f"parameters: {{{param}: {value}}}\n" if param != "density" else ""
    config.write_text(f"merge_method: ties\nbase_model: a\nmodels:\n  - model: a\n  - model: b\n{where}{shared}"
                      "dtype: float32\n")
    refused(models, config, word)


@pytest.mark.parametrize("weights", ["[.nan, 1]", "[1, -1]"])
def test_a_recipe_linear_op(models: Path, weights: str) -> None:
    recipe = models / "r.yaml"
    recipe.write_text("version: 1\nsources:\n  - {path: a/model.safetensors, name: a}\n"
                      "  - {path: b/model.safetensors, name: b}\n"
                      f"ops:\n  - linear: {{from: ['a\\.(.*)', 'b.$1'], weights: {weights}, to: '$1'}}\n"
                      "target: {path: o.safetensors}\n")
    p = migrate_in_process("run", str(recipe), "--no-progress")
    err = p.stdout + p.stderr
    assert p.returncode == 2 and "Traceback" not in err and "r.yaml:6" in err, err
    assert not (models / "o.safetensors").exists()


def test_a_lora_scale_or_alpha_that_is_not_finite(models: Path) -> None:
    from migrator.core.errors import AdapterError
    from migrator.transform.merging.peft_adapter import parse_config

    p = migrate_in_process("convert", str(models / "a" / "model.safetensors"), str(models / "o.safetensors"),
                           "--lora", str(models / "b"), "--lora-scale", "nan")
    assert p.returncode == 2 and "finite" in p.stderr and "Traceback" not in p.stderr, p.stderr
    for alpha in (math.inf, -math.inf, math.nan):  # JSON's 1e400 reads as inf
        with pytest.raises(AdapterError, match="finite"):
            parse_config({"peft_type": "LORA", "r": 2, "lora_alpha": alpha}, "adapter_config.json")
    with pytest.raises(AdapterError, match="positive integer ranks"):
        parse_config({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "rank_pattern": {"q": 0}}, "adapter_config.json")

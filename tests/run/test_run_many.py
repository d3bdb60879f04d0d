"""`migrate run|plan|validate` with `--source/--target` overrides, and `run` with several recipes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.support.cli import migrate_subprocess

REPO = Path(__file__).resolve().parents[2]


migrate = migrate_subprocess


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"enc.weight": rng.standard_normal((3, 4)).astype(np.float32), "enc.bias": np.arange(3, dtype=np.float32)}


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    """A checked-in recipe in its own folder, reading `a.safetensors` there and writing `out.safetensors`."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    save_file(_weights(0), str(folder / "a.safetensors"))
    path = folder / "r.yaml"
    path.write_text("version: 1\nsource: {path: a.safetensors}\nremap: [{from: '^enc\\.', to: 'encoder.'}]\n"
                    "target: {path: out.safetensors}\n")
    return path


def test_source_and_target_override_the_recipe_paths_from_the_current_folder(recipe: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    save_file(_weights(1), str(work / "b.safetensors"))
    out = migrate("run", str(recipe), "--source", "b.safetensors", "--target", "b-out.safetensors",
                  "--no-progress", "--report", "rep.json", cwd=work)
    assert out.returncode == 0, out.stderr
    assert not (recipe.parent / "out.safetensors").exists()  # the recipe's own target is untouched
    got = load_file(str(work / "b-out.safetensors"))
    want = _weights(1)
    assert sorted(got) == ["encoder.bias", "encoder.weight"]
    np.testing.assert_array_equal(got["encoder.weight"], want["enc.weight"])
    report = json.loads((work / "rep.json").read_text())
    assert report["overrides"] == {"source": "b.safetensors", "target": "b-out.safetensors"}
    assert report["source"] == str(work / "b.safetensors")
    assert report["target"] == str(work / "b-out.safetensors")


def test_plan_and_validate_take_the_overrides(recipe: Path, tmp_path: Path) -> None:
    save_file({"x.weight": np.zeros((2, 2), np.float32)}, str(tmp_path / "other.safetensors"))
    plan = migrate("plan", str(recipe), "--source", "other.safetensors", "--target", "o.bpk", "--json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    assert doc["source"] == str(tmp_path / "other.safetensors") and doc["target"] == str(tmp_path / "o.bpk")
    assert [e["target"] for e in doc["entries"]] == ["x.weight"]
    val = migrate("validate", str(recipe), "--target", "o.bpk", "--json", cwd=tmp_path)
    assert val.returncode == 0, val.stdout
    assert json.loads(val.stdout)["recipes"][0]["target"] == str(tmp_path / "o.bpk")
    missing = migrate("validate", str(recipe), "--source", "nope.safetensors", cwd=tmp_path)
    assert missing.returncode == 1 and "nope.safetensors" in missing.stderr


def test_overrides_with_several_recipes_are_a_usage_error(recipe: Path, tmp_path: Path) -> None:
    out = migrate("validate", str(recipe), str(recipe), "--target", "x.bpk", cwd=tmp_path)
    assert out.returncode == 2 and "one recipe only" in out.stderr


def test_an_override_target_onto_the_source_is_refused(recipe: Path, tmp_path: Path) -> None:
    before = (recipe.parent / "a.safetensors").read_bytes()
    out = migrate("run", str(recipe), "--target", str(recipe.parent / "a.safetensors"), "--overwrite",
                  "--no-progress", cwd=tmp_path)
    assert out.returncode == 2 and "same file as the source" in out.stderr
    assert (recipe.parent / "a.safetensors").read_bytes() == before

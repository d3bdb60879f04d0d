"""Issue 20 item 19 for PyTorch checkpoints and recipes: a mistyped top_level_key of a checkpoint
torch saved gets "did you mean", on the command line and in a recipe, where the error names the
recipe line of `source.top_level_key`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_subprocess

torch = pytest.importorskip("torch")


migrate = migrate_subprocess


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    sd = torch.nn.Linear(2, 3).state_dict()
    torch.save({"model": {"state_dict": sd}, "optimizer": {"lr": 0.1}, "epoch": 3}, tmp_path / "ckpt.pt")
    return tmp_path / "ckpt.pt"


@pytest.mark.parametrize(("key", "guess"), [("modle", "model"), ("model.stat_dict", "state_dict")])
def test_convert_top_level_key_typo(ckpt: Path, key: str, guess: str) -> None:
    out = migrate("convert", ckpt.name, "out.bpk", "--top-level-key", key, cwd=ckpt.parent)
    assert out.returncode == 1 and f"did you mean '{guess}'?" in out.stderr, out.stderr
    assert not (ckpt.parent / "out.bpk").exists()


def test_recipe_top_level_key_typo_names_the_recipe_line(ckpt: Path) -> None:
    (ckpt.parent / "r.yaml").write_text("version: 1\nsource:\n  path: ckpt.pt\n  top_level_key: model.stat_dict\n"
                                        "target: {path: out.bpk}\n")
    out = migrate("run", "r.yaml", cwd=ckpt.parent)
    assert out.returncode == 1, out.stderr
    assert "r.yaml:4:18: source.top_level_key: " in out.stderr and "did you mean 'state_dict'?" in out.stderr
    checked = migrate("validate", "r.yaml", "--json", cwd=ckpt.parent)
    doc = json.loads(checked.stdout)
    error = doc["recipes"][0]["error"]
    assert "r.yaml:4:18: source.top_level_key" in error["message"] and error["file"] == str(ckpt)
    assert not (ckpt.parent / "out.bpk").exists()

"""Issue 20 item 11: with the original checkpoint as target.template, Burn's renumbered names find
their way back, so `.pt -> .bpk -> .pt` round-trips with one recipe and no hand-written remaps.

The oracle is torch: the state_dict torch itself saved, compared with torch.equal and loaded back
with load_state_dict(strict=True)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from migrator.plan.build import build_plan
from migrator.recipe.model import Recipe
from migrator.run.execute import run_plan
from migrator.transform.template_match import AmbiguousMatch, match_slots

torch = pytest.importorskip("torch")
nn = torch.nn


def gapped_mlp() -> Any:
    """Parameters at 0, 3, 5, 6 (ReLU and Dropout hold none): Burn numbers them 0, 1, 2, 3."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(), nn.Linear(8, 6), nn.ReLU(), nn.LayerNorm(6),
                         nn.Linear(6, 3))


def square_mlp(layers: int) -> Any:
    """Linear(8, 8) layers with a ReLU between each: every weight has one shape, so only the names
    tell the layers apart (a wrong match would not show as a shape mismatch)."""
    torch.manual_seed(1)
    mods: list[Any] = []
    for i in range(layers):
        mods += [nn.Linear(8, 8)] + ([nn.ReLU()] if i < layers - 1 else [])
    return nn.Sequential(*mods)


def run(tmp_path: Path, recipe: dict[str, Any]) -> Any:
    with build_plan(Recipe.model_validate({"version": 1, **recipe}), tmp_path) as plan:
        if not plan.ok:
            return plan
        run_plan(plan, progress=False)
        return plan


def assert_same_state(expected: dict[str, Any], path: Path, model: Any) -> None:
    back = torch.load(path, weights_only=True)
    assert list(back) == list(expected)
    assert all(torch.equal(back[k], expected[k]) for k in expected)
    model.load_state_dict(back, strict=True)


def test_pt_to_burnpack_and_back_restores_torch_names(tmp_path: Path) -> None:
    model = gapped_mlp()
    sd = model.state_dict()
    assert [k.split(".")[0] for k in sd] == ["0", "0", "3", "3", "5", "5", "6", "6"]
    torch.save(sd, tmp_path / "orig.pt")
    there = subprocess.run([sys.executable, "-m", "migrator.cli", "convert", "orig.pt", "m.bpk", "--adapter",
                            "pytorch_to_burn", "--modules", "LayerNorm=^2$"], cwd=tmp_path, capture_output=True,
                           text=True)
    assert there.returncode == 0, there.stderr
    (tmp_path / "back.yaml").write_text("version: 1\nsource: {path: m.bpk}\nadapters: [burn_to_pytorch]\n"
                                        "target: {path: back.pt, template: orig.pt}\n")
    back = subprocess.run([sys.executable, "-m", "migrator.cli", "run", "back.yaml", "--report", "r.json"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert back.returncode == 0, back.stdout + back.stderr
    assert_same_state(sd, tmp_path / "back.pt", gapped_mlp())
    import json

    pairs = {t["target"]: t["source"] for t in json.loads((tmp_path / "r.json").read_text())["tensors"]}
    assert pairs["3.weight"] == "1.weight" and pairs["5.weight"] == "2.gamma" and pairs["6.bias"] == "3.bias"


def test_pt_to_pt_with_its_own_template_keeps_every_layer(tmp_path: Path) -> None:
    # the source renumbers 0,2,4,6 to 0,1,2,3; by name, template slot '2.weight' would take the source's
    # third layer (its '4.weight'), with the same shape: the slot is matched by position instead
    model = square_mlp(4)
    sd = model.state_dict()
    torch.save(sd, tmp_path / "orig.pt")
    plan = run(tmp_path, {"source": {"path": "orig.pt"}, "target": {"path": "out.pt", "template": "orig.pt"}})
    assert plan.ok, plan.fatal
    assert_same_state(sd, tmp_path / "out.pt", square_mlp(4))


def test_two_ways_to_match_is_an_error(tmp_path: Path) -> None:
    # the template numbers its layers 0,2,4; the source holds five layers 0..4 (no gaps): by name
    # (0,2,4) and by position (0,1,2) both fill every slot, with different weights
    torch.save(square_mlp(3).state_dict(), tmp_path / "tpl.pt")
    from safetensors.torch import save_file

    five = {f"{i}.{p}": torch.full((8, 8) if p == "weight" else (8,), float(i)) for i in range(5)
            for p in ("weight", "bias")}
    save_file(five, tmp_path / "src.safetensors")
    plan = run(tmp_path, {"source": {"path": "src.safetensors"}, "target": {"path": "out.pt", "template": "tpl.pt"}})
    assert not plan.ok
    text = "\n".join(plan.fatal)
    assert "match two ways" in text and "'2.weight' is '2.weight' by name, '1.weight' by index position" in text
    assert not (tmp_path / "out.pt").exists()


def test_match_slots_rules() -> None:
    names = {"a.0.w", "a.1.w", "a.2.w", "head"}
    look = lambda n: n if n in names else None  # noqa: E731
    assert match_slots(["a.0.w", "a.3.w", "a.5.w", "head"], look) == ["a.0.w", "a.1.w", "a.2.w", "head"]
    assert match_slots(["a.0.w", "a.1.w"], look) == ["a.0.w", "a.1.w"]  # contiguous template: by name
    assert match_slots(["a.0.w", "a.7.w", "x"], look) == ["a.0.w", "a.1.w", None]  # partial: merged
    with pytest.raises(AmbiguousMatch, match="neither fills every slot"):
        match_slots(["a.1.w", "a.5.w", "x"], look)  # by name a.1 -> a.1, by position a.5 -> a.1

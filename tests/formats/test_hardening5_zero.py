"""Issue 41, class 7 (ZeRO with `--training-state keep`, and `inspect --json`): optimizer state whose ids,
steps or hyperparameters the reader cannot take as they are, each refused with one line naming the
rank file (the shared promises, `hostile.refused`), and the ones it can take carried as torch
would carry them (a NaN step on every rank is one value, not a disagreement)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.hostile import refused
from tests.support.rank_sets import zero_states, zero_step

torch = pytest.importorskip("torch")

Edit = Callable[[list[dict[str, Any]]], None]


def _with_optimizer(folder: Path, edit: Edit | None = None) -> Path:
    """The two-rank ZeRO-1 step with Adam's state: one flat group, each rank's moments as long as its
    partition with padding (8 + 1), a plain step, hyperparameters as torch saves them."""
    model, optims = zero_states()
    for o in optims:
        osd = o["optimizer_state_dict"]
        osd["base_optimizer_state"] = {
            "state": {0: {"step": 3, "exp_avg": torch.ones(9), "exp_avg_sq": torch.ones(9)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "params": [0]}]}
    if edit is not None:
        edit(optims)
    return zero_step(folder, model, optims)


def _base(optims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["optimizer_state_dict"]["base_optimizer_state"] for o in optims]


def _params(value: Any) -> Edit:
    def edit(optims: list[dict[str, Any]]) -> None:
        for b in _base(optims):
            b["param_groups"][0]["params"] = [value]
            b["state"] = {}
    return edit


def _stray(optims: list[dict[str, Any]]) -> None:
    for b in _base(optims):
        b["state"][7] = {"step": 3, "exp_avg": torch.ones(9)}


def _step(value: Any) -> Edit:
    def edit(optims: list[dict[str, Any]]) -> None:
        for b in _base(optims):
            b["state"][0]["step"] = value
    return edit


def _deep(optims: list[dict[str, Any]]) -> None:
    nested: Any = 1
    for _ in range(300):
        nested = [nested]
    for b in _base(optims):
        b["param_groups"][0]["schedule"] = nested


CASES: dict[str, tuple[Edit, str]] = {
    "an unhashable id": (_params([0]), "not a parameter id"),
    "a dict id": (_params({"a": 1}), "not a parameter id"),
    "an id of 2^70": (_params(2**70), "71 bits"),
    "state for an id no group lists": (_stray, "no param group lists"),
    "a step of 2^70": (_step(2**70), "beyond 64"),
    "a hyperparameter nested 300 deep": (_deep, "nested deeper"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_zero_optimizer_state_refused(case: str, tmp_path: Path) -> None:
    edit, words = CASES[case]
    root = tmp_path / "w"
    folder = _with_optimizer(root / "ckpt", edit)
    refused(["convert", str(folder), str(root / "out.pt"), "--training-state", "keep"], root, words=words)


def test_the_good_step_converts(tmp_path: Path) -> None:
    folder = _with_optimizer(tmp_path / "ckpt")
    done = migrate_in_process("convert", str(folder), str(tmp_path / "out.pt"), "--training-state", "keep")
    assert done.returncode == 0, done.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert out["optimizer"]["param_groups"][0]["param_names"] == ["a.weight", "a.bias"]
    assert out["optimizer"]["state"][0]["step"] == 3  # torch's layout: ids, names beside them


def test_a_nan_step_on_every_rank_is_carried_not_a_disagreement(tmp_path: Path) -> None:
    folder = _with_optimizer(tmp_path / "ckpt", _step(float("nan")))
    done = migrate_in_process("convert", str(folder), str(tmp_path / "out.pt"), "--training-state", "keep")
    assert done.returncode == 0, done.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert math.isnan(out["optimizer"]["state"][0]["step"])


def test_inspect_json_of_deeply_nested_hyperparameters(tmp_path: Path) -> None:
    folder = _with_optimizer(tmp_path / "ckpt", _deep)
    done = migrate_in_process("inspect", "--json", str(folder))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    shown = json.loads(done.stdout)
    assert "schedule" not in json.dumps(shown)  # a nested value is no hyperparameter to show

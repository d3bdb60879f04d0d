"""Issue 41, class 7 (Burn records and --optimizer-out): each case a checkpoint torch wrote, broken
in one place, refused with one line naming what is wrong, nothing written (the shared promises,
`hostile.refused`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.hostile import refused

torch = pytest.importorskip("torch")
nn = torch.nn


def _checkpoint(folder: Path, step: Any) -> Path:
    """A Linear trained one AdamW step by torch, its `step` then replaced by `step`."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.named_parameters(), foreach=False)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    sd = opt.state_dict()
    for state in sd["state"].values():
        state["step"] = step
    path = folder / "ckpt.pt"
    torch.save({"model": net.state_dict(), "optimizer": sd}, path)
    return path


@pytest.mark.parametrize("step", [float("nan"), float("inf"), -float("inf"), 1e30, 2**70, torch.tensor(float("nan")),
                                  torch.tensor(float("inf")), torch.tensor(1e30), 0, 2.5],
                         ids=["nan", "inf", "-inf", "1e30", "2^70", "t-nan", "t-inf", "t-1e30", "zero", "fraction"])
def test_a_step_burn_cannot_count_is_refused(step: Any, tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "w", step)
    target = tmp_path / "w" / "out.bpk"
    refused(["convert", str(ckpt), str(target), "--top-level-key", "model", "--training-state", "keep"],
            tmp_path / "w", words="step")


def test_a_good_step_still_writes_the_record(tmp_path: Path) -> None:
    from tests.support.cli import migrate_in_process

    ckpt = _checkpoint(tmp_path, torch.tensor(3.0))
    done = migrate_in_process("convert", str(ckpt), str(tmp_path / "out.bpk"), "--top-level-key", "model",
                              "--training-state", "keep")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out-optim.bpk").is_file()


@pytest.mark.parametrize("target", ["out.safetensors", "out.pt"])
def test_optimizer_out_with_another_target_is_refused(target: str, tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "w", torch.tensor(3.0))
    refused(["convert", str(ckpt), str(tmp_path / "w" / target), "--top-level-key", "model", "--training-state",
             "keep", "--optimizer-out", str(tmp_path / "w" / "o.bpk")], tmp_path / "w", words="--optimizer-out")

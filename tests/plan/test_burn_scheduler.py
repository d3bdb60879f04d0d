"""A PyTorch LR scheduler's state into Burn's `LrSchedulerRecord` (`training_state: keep` into a .bpk).

The oracle for the rates is torch: the scheduler, stepped on, gives the rates a resumed run must use.
Burn's side is its source (tracel-ai/burn, crate burn-optim, `lr_scheduler/`), transcribed here as the
four `step()` functions below, started from the record's counter as `load_record` sets it:

- `step.rs`: `StepLrScheduler { init_lr, step_size, gamma, iter_idx: i32 }`, `iter_idx` starts at -1;
  `step()`: `iter_idx += 1; init_lr * gamma.powi(iter_idx / step_size)`. State: `iter_idx`.
- `exponential.rs`: `previous_lr` starts at `initial_lr / gamma`; `step()`: `previous_lr *= gamma`.
- `cosine.rs`: `current_iter: usize` starts at `usize::MAX`; `step()`: wrapping `+ 1`, then
  `min + 0.5 (max - min) (1 + cos(current_iter / num_iters * pi))`.
- `linear.rs`: `remaining_iters` starts at `num_iters + 1`; `step()`: `-= 1` unless 0, then
  `final_lr - step_size * remaining_iters` with `step_size = (final - initial) / num_iters`.
- `module_lr_scheduler.rs`: the Learner's `ModuleLrScheduler` records group `i` under `"{i}."`; the base
  scheduler is group 0. `base.rs`: the record is a burnpack of scalars only (`Writer::new(Vec::new())`),
  typed by `Scalar::from` (`burn-pack/src/base.rs`: i32 -> Int, usize -> UInt, f64 -> Float).

The file is read with the independent burnpack parser of test_burn_optimizer.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.burnpack import parse_burnpack
from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
S = torch.optim.lr_scheduler
USIZE_MAX = 2**64 - 1
LR = 0.1


def _burn_step(kind: str, torch_sched: Any, state: dict[str, Any]) -> Callable[[], float]:
    """Burn's scheduler of `kind`, configured as the torch scheduler is, its state loaded from the record."""
    if kind == "StepLR":
        idx = [state["0.iter_idx"]["Int"]]

        def step() -> float:
            idx[0] += 1
            return LR * torch_sched.gamma ** (idx[0] // torch_sched.step_size)
        return step
    if kind == "ExponentialLR":
        prev = [state["0.previous_lr"]["Float"]]

        def step() -> float:
            prev[0] *= torch_sched.gamma
            return prev[0]
        return step
    if kind == "CosineAnnealingLR":
        cur = [state["0.current_iter"]["UInt"]]

        def step() -> float:
            cur[0] = (cur[0] + 1) % 2**64
            return torch_sched.eta_min + 0.5 * (LR - torch_sched.eta_min) * (
                1 + math.cos(cur[0] / torch_sched.T_max * math.pi))
        return step
    assert kind == "LinearLR"
    initial, final, n = LR * torch_sched.start_factor, LR * torch_sched.end_factor, torch_sched.total_iters
    rem = [state["0.remaining_iters"]["UInt"]]

    def step() -> float:
        rem[0] -= rem[0] != 0
        return final - (final - initial) / n * rem[0]
    return step


MAKERS = {
    "StepLR": lambda o: S.StepLR(o, step_size=3, gamma=0.5),
    "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.9),
    "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.001),
    "LinearLR": lambda o: S.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=6),
}


def _checkpoint(tmp_path: Path, make: Callable[[Any], Any] | list[Callable[[Any], Any]], steps: int) -> Any:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=LR)
    scheds = [m(opt) for m in (make if isinstance(make, list) else [make])]
    for _ in range(steps):
        net(torch.randn(4, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
        for s in scheds:
            s.step()
    saved: dict[str, Any] = {"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 1}
    saved.update({("scheduler" if i == 0 else f"scheduler{i}"): s.state_dict() for i, s in enumerate(scheds)})
    torch.save(saved, tmp_path / "ckpt.pt")
    return scheds[0]


def _convert(tmp_path: Path) -> Any:
    done = migrate_in_process("convert", str(tmp_path / "ckpt.pt"), str(tmp_path / "out.bpk"),
                              "--training-state", "keep", "--top-level-key", "model")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    return done


@pytest.mark.parametrize("steps", [0, 1, 5, 13])
@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_burns_scheduler_resumes_where_torchs_would(tmp_path: Path, kind: str, steps: int) -> None:
    sched = _checkpoint(tmp_path, MAKERS[kind], steps)
    done = _convert(tmp_path)
    path = tmp_path / "out-scheduler.bpk"
    assert f"Burn's LR scheduler record: {path}" in done.stdout
    _, meta, arrays = parse_burnpack(path)
    assert meta["tensors"] == {} and meta.get("metadata", {}) == {} and arrays == {}
    field = {"StepLR": "iter_idx", "ExponentialLR": "previous_lr", "CosineAnnealingLR": "current_iter",
             "LinearLR": "remaining_iters"}[kind]
    assert list(meta["scalars"]) == [f"0.{field}"]
    burn = _burn_step(kind, sched, meta["scalars"])
    opt = sched.optimizer
    for _ in range(12):  # the rate each next step uses: torch's current one, then it steps on
        want = opt.param_groups[0]["lr"]
        assert burn() == pytest.approx(want, rel=1e-12, abs=1e-15)
        opt.step()
        sched.step()


def test_a_fresh_cosine_scheduler_wraps_from_usize_max(tmp_path: Path) -> None:
    _checkpoint(tmp_path, MAKERS["CosineAnnealingLR"], 0)
    _convert(tmp_path)
    _, meta, _ = parse_burnpack(tmp_path / "out-scheduler.bpk")
    assert meta["scalars"] == {"0.current_iter": {"UInt": USIZE_MAX}}


@pytest.mark.parametrize(("make", "name"), [
    (lambda o: S.PolynomialLR(o, total_iters=4), "PolynomialLR"),
    (lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3), "CosineAnnealingWarmRestarts"),
    (lambda o: S.OneCycleLR(o, max_lr=1.0, total_steps=20), "OneCycleLR"),
])
def test_a_scheduler_burn_has_not_is_named_and_no_record_written(tmp_path: Path, make: Any, name: str) -> None:
    _checkpoint(tmp_path, make, 3)
    done = _convert(tmp_path)
    assert f"LR scheduler 'scheduler' ({name}): Burn has no scheduler of the same formula" in done.stdout
    assert not (tmp_path / "out-scheduler.bpk").exists() and (tmp_path / "out-optim.bpk").exists()


def test_two_schedulers_write_no_record(tmp_path: Path) -> None:
    _checkpoint(tmp_path, [MAKERS["StepLR"], MAKERS["LinearLR"]], 2)
    done = _convert(tmp_path)
    assert "2 LR schedulers ('scheduler' (StepLR), 'scheduler1' (LinearLR))" in done.stdout
    assert not (tmp_path / "out-scheduler.bpk").exists()


def test_an_existing_scheduler_record_is_refused_and_nothing_is_published(tmp_path: Path) -> None:
    _checkpoint(tmp_path, MAKERS["StepLR"], 2)
    (tmp_path / "out-scheduler.bpk").write_bytes(b"old")
    done = migrate_in_process("convert", str(tmp_path / "ckpt.pt"), str(tmp_path / "out.bpk"),
                              "--training-state", "keep", "--top-level-key", "model")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert (tmp_path / "out-scheduler.bpk").read_bytes() == b"old"
    assert not (tmp_path / "out.bpk").exists() and not (tmp_path / "out-optim.bpk").exists()

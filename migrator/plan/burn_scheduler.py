"""A PyTorch LR scheduler's state as Burn's `LrSchedulerRecord`, written beside the optimizer record.

Burn (crate burn-optim, `lr_scheduler/`) keeps a scheduler's state as a burnpack of typed scalars and
nothing else (`LrSchedulerRecord`: `with_scalar`, written by `Writer::new(Vec::new())` plus each scalar).
The Learner's scheduler is a `ModuleLrScheduler`, whose record nests each group's scheduler under its
index (`with_record(&index.to_string(), ..)`): the base scheduler, the one a torch scheduler becomes,
is group `0`. Each scheduler's state is a `RecordState` struct of one counter (`base.rs`, and per kind):

| torch | Burn | its state, after torch's N = `last_epoch` steps |
|---|---|---|
| `StepLR` | `StepLrScheduler` | `iter_idx: i32` (Int): N - 1 (it starts at -1 and steps before each use) |
| `ExponentialLR` | `ExponentialLrScheduler` | `previous_lr: f64` (Float): `initial / gamma`, times gamma N times |
| `CosineAnnealingLR` | `CosineAnnealingLrScheduler` | `current_iter: usize` (UInt): N - 1, wrapping from `usize::MAX` |
| `LinearLR` | `LinearLrScheduler` | `remaining_iters: usize` (UInt): total_iters + 1 - N, at least 0 |

Each Burn scheduler's next `step()` then returns the rate torch's would use at step N + 1 (the torch
scheduler's closed form; Burn's counterparts compute the same formula). The other torch schedulers
have no Burn counterpart of the same formula: they are named in a note, and no record is written.
A torch scheduler's state dict names no class: it is told by its own keys (`KINDS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.scalars import Scalar

if TYPE_CHECKING:
    from ..formats.pytorch.tree import CheckpointTree, Node

COMMON = frozenset({"base_lrs", "last_epoch", "_step_count", "_get_lr_called_within_step", "_is_initial",
                    "_last_lr", "verbose"})
"""What every torch LRScheduler's state_dict holds (its own attributes but the optimizer)."""
KINDS = {frozenset({"step_size", "gamma"}): "StepLR", frozenset({"gamma"}): "ExponentialLR",
         frozenset({"T_max", "eta_min"}): "CosineAnnealingLR",
         frozenset({"start_factor", "end_factor", "total_iters"}): "LinearLR",
         frozenset({"gamma", "milestones"}): "MultiStepLR", frozenset({"factor", "total_iters"}): "ConstantLR",
         frozenset({"power", "total_iters"}): "PolynomialLR", frozenset({"lr_lambdas"}): "LambdaLR or MultiplicativeLR",
         frozenset({"T_0", "T_i", "T_mult", "T_cur", "eta_min"}): "CosineAnnealingWarmRestarts"}
"""A torch scheduler's own keys (beyond `COMMON`) -> its class."""
BURN = {"StepLR": "StepLrScheduler (StepLrSchedulerConfig)", "ExponentialLR": "ExponentialLrScheduler "
        "(ExponentialLrSchedulerConfig)", "CosineAnnealingLR": "CosineAnnealingLrScheduler "
        "(CosineAnnealingLrSchedulerConfig)", "LinearLR": "LinearLrScheduler (LinearLrSchedulerConfig)"}
GROUP = "0"  # ModuleLrScheduler's base scheduler
USIZE_MAX = 2**64 - 1
MAX_REPLAYED = 10**7  # ExponentialLR: Burn's rate is a product of N factors, replayed one by one (~1 s)


@dataclass
class SchedulerRecord:
    """Burn's record of the one scheduler it can hold, and what is said of every scheduler found."""

    scalars: dict[str, Scalar] = field(default_factory=dict)
    kind: str = ""
    path: str = ""
    notes: list[str] = field(default_factory=list)


def default_scheduler_path(target: Path) -> Path:
    """Beside the model, `<stem>-scheduler.bpk` (Burn's file checkpointer: model-N, optim-N, scheduler-N)."""
    return target.with_name(f"{target.stem}-scheduler.bpk")


def scheduler_record(tree: CheckpointTree | None) -> SchedulerRecord:
    """The record of the checkpoint's LR scheduler when it is one Burn has (empty scalars otherwise);
    the notes name each scheduler found and what became of it."""
    out = SchedulerRecord()
    found = _schedulers(tree)
    if len(found) > 1:
        shown = ", ".join(f"'{p}' ({k})" for p, k, _ in found)
        out.notes.append(f"{len(found)} LR schedulers ({shown}): Burn's LrSchedulerRecord is one scheduler's, so "
                         "none is written; their numbers stay scalars of the model file")
        return out
    for path, kind, node in found:
        values = dict(node.items())
        made = _record(kind, values)
        if isinstance(made, str):
            out.notes.append(f"LR scheduler '{path}' ({kind}): {made}; its numbers stay scalars of the model file")
            continue
        out.scalars = {f"{GROUP}.{k}": v for k, v in made.items()}
        out.kind, out.path = kind, path
        out.notes.append(f"LR scheduler '{path}' ({kind}, after {values['last_epoch']} steps): written as Burn's "
                         f"LrSchedulerRecord of a ModuleLrScheduler whose base is {BURN[kind]}; its rates and "
                         "lengths are the config's (set them as torch's), the record holds its counter")
    return out


def _schedulers(tree: CheckpointTree | None) -> list[tuple[str, str, Node]]:
    """Every dict of the checkpoint that is a torch LR scheduler's state_dict: (dotted path, kind, node)."""
    from ..formats.pytorch.tree import Node

    if tree is None:
        return []
    found: list[tuple[str, str, Node]] = []
    todo: list[tuple[Node, str]] = [(tree.root, "")]
    while todo:
        node, path = todo.pop()
        keys = {k for k in node.keys if isinstance(k, str)} if node.is_dict else set()
        if "last_epoch" in keys and ("base_lrs" in keys or "_last_lr" in keys):
            own = frozenset(keys - COMMON)
            found.append((path, KINDS.get(own, _other(own)), node))
            continue
        for key, value in node.items():
            if isinstance(value, Node):
                todo.append((value, f"{path}.{key}" if path else str(key)))
    return sorted(found, key=lambda f: f[0])


def _other(keys: frozenset[str]) -> str:
    for name, marks in (("ReduceLROnPlateau", {"patience", "cooldown"}), ("OneCycleLR", {"total_steps"}),
                        ("CyclicLR", {"max_lrs"}), ("SequentialLR or ChainedScheduler", {"_schedulers"})):
        if marks <= keys:
            return name
    return "a scheduler of keys " + ", ".join(sorted(keys))


def _record(kind: str, values: dict[Any, Any]) -> dict[str, Scalar] | str:
    """Burn's state fields of a torch scheduler's state, or why there is none."""
    if kind not in BURN:
        return "Burn has no scheduler of the same formula, so no LrSchedulerRecord is written"
    steps = values.get("last_epoch")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        return f"last_epoch is {steps!r}, not a count of steps"
    if kind == "StepLR":
        if steps > 2**31:
            return f"last_epoch {steps} is past Burn's i32 iter_idx"
        return {"iter_idx": Scalar("Int", steps - 1)}
    if kind == "CosineAnnealingLR":
        return {"current_iter": Scalar("UInt", steps - 1 if steps else USIZE_MAX)}
    if kind == "LinearLR":
        total = values.get("total_iters")
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            return f"total_iters is {total!r}, not a positive count"
        return {"remaining_iters": Scalar("UInt", max(total + 1 - steps, 0))}
    gamma, lrs = values.get("gamma"), values.get("base_lrs")
    from ..formats.pytorch.tree import Node

    bases = [float(b) for b in lrs.values if isinstance(b, (int, float)) and not isinstance(b, bool)] if isinstance(
        lrs, Node) else []
    if not isinstance(gamma, (int, float)) or isinstance(gamma, bool) or not 0 < gamma <= 1:
        return f"gamma is {gamma!r}: Burn's ExponentialLrScheduler takes 0 < gamma <= 1"
    if not bases or len(set(bases)) != 1 or len(bases) != len(lrs.values):  # type: ignore[union-attr]
        return ("its param groups start from different rates (base_lrs): Burn's ExponentialLrScheduler holds one "
                "rate (previous_lr) for every group")
    if steps > MAX_REPLAYED:
        return f"last_epoch {steps} is more steps than migrator replays Burn's recurrence for ({MAX_REPLAYED:,})"
    previous = bases[0] / float(gamma)  # Burn's start, so its first step gives the initial rate
    for _ in range(steps):
        previous *= float(gamma)
    return {"previous_lr": Scalar("Float", previous)}

"""A PyTorch optimizer's state as Burn's `OptimizerRecord`, so a PyTorch training run resumes in Burn.

Burn (crate burn-optim, after the burnpack move of PR #5083) saves a `ModuleOptimizer` as a burnpack
of its own, beside the model's. What this module writes, and where in Burn's source each rule is read
(tracel-ai/burn; the commits are those docs/burn-compatibility.md names):

- `optim/module/module_optimizer.rs`, `to_record`: one entry per parameter, keyed by the decimal text
  of its ParamId (`id.val().to_string()`): every state tensor is named `"{param_id}.{field path}"` and
  carries `param_id`; the scalar `"{param_id}.__rank"` is the parameter's rank (`Scalar::from(usize)`,
  so `UInt`); `paths` maps `"{param_id}"` to the parameter's module path (its name in the model's
  burnpack). `load_record` gives each state to the parameter of that ParamId, which a model loaded
  from a burnpack takes from the file's `param_id`.
- `optim/module/record/mod.rs`: the record's tensors and scalars are the burnpack's, `paths` its
  metadata map, and nothing else (`Writer::new` adds no default metadata: `burn-pack/src/writer.rs`).
- the state derive (`burn-derive/src/record_state/mod.rs`): a field is `"{prefix}.{field}"`, a nested
  state adds its field's name, an absent `Option` writes nothing; `usize` fields are `UInt` scalars.
- `optim/adamw.rs`, `optim/adam.rs`: `AdamWState`/`AdamState { momentum: AdaptiveMomentumState { time,
  moment_1, moment_2, max_moment_2: Option } }`, so `momentum.moment_1`, `momentum.moment_2`,
  `momentum.max_moment_2` (AMSGrad) and the scalar `momentum.time`. Their update is torch's: moment_1 is
  exp_avg, moment_2 exp_avg_sq, time torch's step.
- `optim/sgd.rs`, `optim/momentum.rs`: `SgdState { momentum: Option<MomentumState { velocity }> }`, so
  `momentum.velocity`: torch's momentum_buffer (the same recurrence, first step the gradient itself).

The moments come here already through the recipe (`training_state.follow`): a Linear's weight
transposed for Burn has its moments transposed the same way. Every tensor of the model gets a u64
`param_id` derived from the source's tensor table and its name (`derived_ids`): reproducible like
every output, and other for another model's checkpoint, so a record never applies to the wrong one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.scalars import Scalar
from ..core.tensor import LazyTensor
from .entry import PlanEntry

if TYPE_CHECKING:
    from .optimizer_dicts import Optimizer
    from .training_state import Training

RANK = "__rank"
ADAM = {"exp_avg": "momentum.moment_1", "exp_avg_sq": "momentum.moment_2", "max_exp_avg_sq": "momentum.max_moment_2"}
SGD = {"momentum_buffer": "momentum.velocity"}
TIME = "momentum.time"


@dataclass
class BurnRecord:
    """Burn's OptimizerRecord for one optimizer: its tensors, scalars and paths (the burnpack's metadata)."""

    optimizer: str  # its path in the checkpoint ('' at the top level)
    kind: str  # "Adam/AdamW" or "SGD"
    tensors: list[LazyTensor] = field(default_factory=list)
    scalars: dict[str, Scalar] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)  # the state's .pt-style name -> its name in the record


def default_record_path(target: Path) -> Path:
    """Where the record goes when `target.optimizer` does not say: beside the model, `<stem>-optim.bpk`
    (Burn's own checkpointer calls its files model-N and optim-N)."""
    return target.with_name(f"{target.stem}-optim.bpk")


def derived_ids(reader: Any, names: Sequence[str], training: Training | None = None, generation: int = 0) -> list[int]:
    """A distinct u64 for each of `names`, derived from the source's tensor table (every name, dtype and
    shape), the optimizers' step counts and the name: the same checkpoint and recipe give the same files
    (migrator's reproducible output); another model's checkpoint, or another step of the same run, gives
    other ids, so a record never applies to a model file it was not written with. `generation` > 0
    gives other ids again, for a pair that replaces one of the same checkpoint (`burn_pair`)."""
    import hashlib

    table = hashlib.sha256()
    for t in reader.tensors:
        table.update(f"{t.name}\0{t.dtype}\0{list(t.shape)}\n".encode())
    by_name = {t.name: t for t in reader.tensors}
    for opt in training.optimizers if training is not None else ():
        for ps in opt.states.values():  # a few scalars: the bytes of each `step`
            if "step" in ps.tensors:
                table.update(bytes(by_name[ps.tensors["step"]].data()))
            elif "step" in ps.plain:
                table.update(repr(ps.plain["step"]).encode())
    if generation:
        table.update(f"generation {generation}\n".encode())
    seed = table.digest()
    out: dict[int, None] = {}
    for name in names:
        salt = 0
        while True:  # a collision of two 64-bit digests: take the next one (it does not happen in practice)
            digest = hashlib.sha256(seed + f"{salt}\0{name}".encode()).digest()
            pid = int.from_bytes(digest[:8], "little")
            if pid not in out:
                out[pid] = None
                break
            salt += 1
    return list(out)


def _with_id(t: LazyTensor, pid: int) -> LazyTensor:
    return LazyTensor(t.name, t.dtype, t.shape, t.nbytes, t.loader, t.span, pid, t.origin, t.chunks)


def burn_record(training: Training, entries: Sequence[PlanEntry], reader: Any,
                fatal: list[str], generation: int = 0) -> tuple[list[PlanEntry], BurnRecord | None]:
    """The model's entries, each tensor given a fresh param_id (of `generation`: `burn_pair`), and the
    record of the optimizer whose state followed the recipe (None when there is none to keep: the notes
    say why)."""
    model = [e for e in entries if e.optimizer is None]
    ids = derived_ids(reader, [e.target for e in model], training, generation)
    model = [replace(e, tensor=_with_id(e.tensor, pid)) for e, pid in zip(model, ids, strict=True)]
    if training.mode != "keep" or not training.optimizers:
        if training.mode == "keep":
            training.notes.append(f"training_state: keep: {reader.label} holds no optimizer state dict; the model "
                                  "is written with a param_id on every tensor, and no optimizer record")
        return model, None
    if len(training.optimizers) > 1:
        fatal.append(f"training_state: keep into burnpack: {reader.label} holds {len(training.optimizers)} optimizers "
                     f"({', '.join(o.label for o in training.optimizers)}); Burn's OptimizerRecord is one "
                     "optimizer's (select the model of one with source.top_level_key, or set training_state: drop)")
        return model, None
    opt = training.optimizers[0]
    if opt.path not in training.swap:  # following the recipe failed: `fatal` says why
        return model, None
    slotted = {e.target: e.tensor for e in entries if e.optimizer is not None}
    by_target = {e.target: e.tensor for e in model}
    try:
        record = _record(opt, training, slotted, by_target)
    except _Refused as e:
        fatal.append(f"training_state: keep into burnpack: the optimizer {opt.label}: {e}")
        return model, None
    training.notes += record.notes
    for fate in training.fates:  # the report names each state where it went: the record's name
        fate["tensor"] = record.renamed.get(fate["tensor"], fate["tensor"])
    return model, record


class _Refused(Exception):
    """Why an optimizer cannot be written as Burn's record."""


def _record(opt: Optimizer, training: Training, slotted: dict[str, LazyTensor],
            model: dict[str, LazyTensor]) -> BurnRecord:
    from ..formats.pytorch.tree import Node, TensorSlot

    node = training.swap[opt.path][0]
    assert isinstance(node, Node)
    state = node.values[node.keys.index("state")]
    assert isinstance(state, Node)
    keys = {str(k) for one in state.values if isinstance(one, Node) for k in one.keys}
    if keys & set(ADAM):
        kind, fields = "Adam/AdamW", ADAM
        known = {*ADAM, "step"}
    elif keys & set(SGD):
        kind, fields = "SGD", SGD
        known = set(SGD)
    elif not keys:  # never stepped: no state to carry, in torch or in Burn
        kind, fields, known = "no state yet", {}, {"-"}
    else:
        known = set()
        kind, fields = "", {}
    if not known or keys - known:
        raise _Refused(f"its state holds {', '.join(sorted(keys))}: Burn's record layout is confirmed from Burn's "
                       "source for Adam/AdamW (exp_avg, exp_avg_sq, max_exp_avg_sq, step) and SGD (momentum_buffer) "
                       "only, so migrator writes no other optimizer (set training_state: drop)")
    _check_groups(opt)
    record = BurnRecord(opt.path, kind)
    owners = training.owners.get(opt.path, {})
    pid_of = {name: t.param_id for name, t in model.items()}
    for new, one in zip(state.keys, state.values, strict=True):
        assert isinstance(one, Node)
        name = owners[new]  # type: ignore[index]
        pid = pid_of[name]
        assert pid is not None
        values = dict(zip(one.keys, one.values, strict=True))
        wrote = False
        for k, v in values.items():
            if str(k) in fields and isinstance(v, TensorSlot):
                t = slotted[v.name]
                record.tensors.append(_with_id(t.renamed(f"{pid}.{fields[str(k)]}"), pid))
                record.renamed[v.name] = f"{pid}.{fields[str(k)]}"
                wrote = True
            elif str(k) == "step" and isinstance(v, TensorSlot):
                record.renamed[v.name] = f"{pid}.{TIME}"
        if not wrote:  # SGD without momentum (momentum_buffer None): Burn re-creates such state on its next step
            continue
        record.scalars[f"{pid}.{RANK}"] = Scalar("UInt", len(model[name].shape))
        if kind == "Adam/AdamW":
            record.scalars[f"{pid}.{TIME}"] = Scalar("UInt", _step(values.get("step"), slotted, name))
        record.paths[str(pid)] = name
    record.notes = _notes(opt, record, _written_params(node))
    return record


def _written_params(node: Any) -> list[int]:
    """How many parameters each param group holds in the output (a split makes more than the source's)."""
    from ..formats.pytorch.tree import Node

    groups = node.values[node.keys.index("param_groups")]
    counts = []
    for group in groups.values if isinstance(groups, Node) else ():
        params: Any = None
        if isinstance(group, Node) and "params" in group.keys:
            params = group.values[group.keys.index("params")]
        counts.append(len(params.values) if isinstance(params, Node) else 0)
    return counts


def _step(value: Any, slotted: dict[str, LazyTensor], name: str) -> int:
    """torch's step (a float tensor, or a number) as Burn's `time`: a whole count of steps."""
    from ..formats.pytorch.tree import TensorSlot

    if isinstance(value, TensorSlot):
        t = slotted[value.name]
        if t.numel != 1:
            raise _Refused(f"the step of '{name}' has {t.numel} values, not one")
        value = t.numpy().reshape(-1)[0].item()
    # NaN and infinities have no int() (a traceback), and Burn's time is a u64: checked before converting
    if isinstance(value, bool) or not isinstance(value, int | float) or (isinstance(value, float) and (
            value != value or value in (float("inf"), float("-inf")))) or not 1 <= value < 1 << 64 \
            or value != int(value):
        shown = (repr(value) if not isinstance(value, int) or value.bit_length() <= 128
                 else f"an integer of {value.bit_length()} bits")
        raise _Refused(f"the step of '{name}' is {shown}: Burn's time is a whole number of steps, 1 to 2^64 - 1")
    return int(value)


_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "momentum", "dampening", "nesterov")


def _group(opt: Optimizer, g: int) -> dict[str, Any]:
    from ..formats.pytorch.tree import Node

    group = opt.groups[g]
    out: dict[str, Any] = {}
    for k, v in zip(group.keys, group.values, strict=True):
        out[str(k)] = tuple(v.values) if isinstance(v, Node) else v  # betas: a tuple
    return out


def _check_groups(opt: Optimizer) -> None:
    for g in range(len(opt.groups)):
        hp = _group(opt, g)
        if hp.get("maximize") is True:
            raise _Refused(f"param group {g} has maximize=True; Burn's Adam, AdamW and SGD only minimize")


def _notes(opt: Optimizer, record: BurnRecord, written: Sequence[int]) -> list[str]:
    """What the record does not hold: the hyperparameters, which Burn takes from the optimizer's config.
    `written`: each group's parameters in the output (after the recipe's splits and drops)."""
    notes = [f"optimizer {opt.label}: written as Burn's OptimizerRecord ({record.kind}; {len(record.paths)} "
             "parameters with state, keyed by the param_id each has in the model file)"]
    for g in range(len(opt.groups)):
        hp = _group(opt, g)
        shown = ", ".join(f"{k} {hp[k]!r}" for k in _GROUP_KEYS if k in hp)
        notes.append(f"optimizer {opt.label}, param group {g} ({written[g]} parameters): {shown}. Burn's "
                     "record holds no hyperparameters: set them in Burn's config and learning rate")
    if record.kind == "Adam/AdamW":
        decoupled = [_group(opt, g).get("decoupled_weight_decay") for g in range(len(opt.groups))]
        which = "AdamW (AdamWConfig)" if all(d is True for d in decoupled) else (
            "Adam (AdamConfig, weight_decay as WeightDecayConfig)" if all(d is False for d in decoupled) else
            "Adam or AdamW (torch records decoupled_weight_decay from 2.6 on)")
        notes.append(f"build it as {which}: the same update as torch's; Burn's defaults differ from torch's "
                     "(epsilon 1e-5, AdamW weight_decay 1e-4; torch: eps 1e-8, AdamW weight_decay 1e-2), and "
                     "amsgrad needs with_amsgrad(true)")
    elif record.kind == "no state yet":
        notes.append("the optimizer has no per-parameter state yet (never stepped): the record is empty")
    elif not record.paths:
        notes.append("build it as SgdConfig: without momentum SGD keeps no state, so the record is empty")
    else:
        notes.append("build it as SgdConfig with MomentumConfig: torch's momentum_buffer is Burn's velocity (the same "
                     "recurrence); Burn's MomentumConfig defaults to dampening 0.1, torch's to 0")
    if len(opt.groups) > 1:
        notes.append("several param groups: in Burn, ModuleOptimizer::with_group routes parameters by their module "
                     "path, which the record's paths give")
    return notes


def without_torch_ids(values: dict[str, Any], training: Training) -> dict[str, Any]:
    """The model file's scalars (or metadata) without what names torch's parameters: the optimizers'
    `params` ids and `param_names` (stale after the recipe, meaningless in Burn) and per-parameter state
    numbers (in the record now). epoch, step, lr, the other hyperparameters and a scheduler's numbers stay."""
    heads = [f"{o.path}." if o.path else "" for o in training.optimizers]
    out = {}
    for k, v in values.items():
        rest = next((k[len(h):] for h in heads if k.startswith(h)), None)
        parts = [] if rest is None else rest.split(".")
        if parts[:1] == ["state"] or (parts[:1] == ["param_groups"] and parts[2:3] in (["params"], ["param_names"])):
            continue
        out[k] = v
    return out

"""Training state through a recipe: a checkpoint's optimizer state follows its parameters.

A PyTorch training checkpoint holds, beside the model, optimizer state dicts (`{"state": {id:
{"step": ..., "exp_avg": ...}}, "param_groups": [{"params": [ids], ...}]}`) whose ids point at the
model's parameters. When a recipe renames, splits or permutes a parameter, the moments must move the
same way or a resumed run applies them to the wrong numbers. Steps 1 and 2 are `optimizer_dicts`;
this module the rest:

1. finds every optimizer state dict in the checkpoint's structure (`formats.pytorch.tree`): a dict
   with `state` and `param_groups`, wherever it sits;
2. tells which parameter each id is (`param_names` in the groups, ids that are names, or the model's
   tensor order when the counts agree exactly), and refuses when none is certain;
3. plans each per-parameter tensor shaped like its parameter by running the SAME pipeline (remaps,
   filter, ops, adapters) over the model's tensors with that moment in the parameter's place: the
   output at each position is the moment of the parameter's output there. There is no second
   implementation of any op;
4. copies scalar state (`step`) to each output of a split and checks it is equal across the inputs of
   a concat or stack; drops the state of parameters the recipe drops; and rebuilds `param_groups`
   (new `params` ids and `param_names` in the output's order, hyperparameters kept).

The result is a set of extra plan entries (`{optimizer}.state.{id}.{key}`) and, per optimizer, the new
container put in place of the old one when the structure is written (`tree.place_tensors(swap=)`).
A source whose state is keyed by names (DCP's `optim.state.<fqn>.exp_avg`) fits the same path: its ids
are the names themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.display import count
from ..core.errors import PlanError
from ..core.tensor import LazyTensor
from ..formats.registry import is_format
from .entry import PlanEntry
from .optimizer_checks import check_state_shapes
from .optimizer_dicts import HINT, Key, Optimizer, ParamState, find_optimizers, identify, model_dict
from .optimizer_order import output_order
from .resume import resume_note

if TYPE_CHECKING:
    from ..formats.pytorch.tree import Node


@dataclass
class Followed:
    """What following the recipe made: extra entries, the containers to swap in, fates, notes."""

    entries: list[PlanEntry] = field(default_factory=list)
    swap: dict[str, tuple[Node | None, int]] = field(default_factory=dict)  # path -> (new node or None, slots)
    fates: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)
    # per optimizer (by path), each kept parameter's new key -> its tensor's name in the output (Burn's record)
    owners: dict[str, dict[Key, str]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------
# following the plan


Replan = Callable[[list[LazyTensor]], "list[PlanEntry]"]
"""The plan's own steps (remap, filter, ops, adapters; no dtype policy) over a list of tensors."""


def follow(optimizers: Sequence[Optimizer], model: Sequence[LazyTensor], tensors: dict[str, LazyTensor],
           entries: Sequence[PlanEntry], replan: Replan, model_prefix: str = "",
           order: Sequence[str] | None = None) -> Followed:
    """Each optimizer's state through the recipe: `model` the tensors the recipe planned (as the reader
    names them), `tensors` every reader tensor by name, `entries` the model's plan, `replan` the same
    pipeline. `model_prefix`: the part of a name before the model's own key (for param_names); `order`:
    the new model's parameter names in its own order, when known (`output_order`)."""
    out = Followed()
    for opt in optimizers:
        try:
            _follow_one(opt, model, tensors, entries, replan, model_prefix, out, order)
        except PlanError as e:
            out.fatal.append(str(e))
    return out


def _sources(entry: PlanEntry) -> list[str]:
    return [] if entry.source is None else entry.source.split(", ")


def _follow_one(opt: Optimizer, model: Sequence[LazyTensor], tensors: dict[str, LazyTensor],
                entries: Sequence[PlanEntry], replan: Replan, model_prefix: str, out: Followed,
                order: Sequence[str] | None = None) -> None:
    from ..formats.pytorch.tree import Node, TensorSlot

    id_of = {name: i for i, name in opt.owner.items()}
    group_of = {i: g for g, ids in enumerate(opt.params) for i in ids}
    shape_of = {t.name: t.shape for t in model}
    # the moments shaped like their parameter, by state key: each is planned by the recipe's own steps
    moment_keys: dict[str, None] = {}
    for i, ps in opt.states.items():
        owner = opt.owner.get(i)
        if owner is None:
            raise PlanError(f"the optimizer {opt.label} has state for id {i!r}, which no param group lists")
        big = [name for name in ps.tensors.values() if tensors[name].numel > 1]
        if opt.rule.startswith("parameter order") and big and all(tensors[n].shape != shape_of.get(owner)
                                                                  for n in big):
            raise PlanError(f"the optimizer {opt.label}'s state {i!r} ({', '.join(big)}: shape "
                            f"{list(tensors[big[0]].shape)}) does not fit '{owner}' (shape "
                            f"{list(shape_of.get(owner, ()))}), its parameter by order: the order is not the "
                            f"model's; {HINT}", file=opt.file, tensor=big[0])
        for k, name in ps.tensors.items():
            if tensors[name].shape == shape_of.get(owner) and tensors[name].numel > 1:
                moment_keys[k] = None
    planned: dict[str, list[PlanEntry]] = {}
    for k in moment_keys:
        subs: list[LazyTensor] = []
        for t in model:
            pid = id_of.get(t.name)
            held = opt.states.get(pid) if pid is not None else None
            moment = held.tensors.get(k) if held is not None else None
            m = tensors[moment] if moment is not None else None
            subs.append(m.renamed(t.name) if m is not None and m.shape == t.shape else t)
        again = replan(subs)
        if [e.target for e in again] != [e.target for e in entries]:
            raise PlanError(f"the optimizer {opt.label}'s '{k}' does not plan as its parameters do (a bug); set "
                            "training_state: drop")
        planned[k] = again
    # which outputs keep state, in which group: the first pass; their ids depend on the order of all
    kept: list[tuple[int, int, list[Key], str]] = []  # (entry index, group, source ids, name in the group)
    used: set[Key] = set()
    by_name = opt.by_name  # DCP's names stay names, whether or not param_names are saved beside them
    base = f"{opt.path}.state." if opt.path else "state."
    prefix = model_prefix + opt.prefix
    depth = prefix.count(".")
    for n, entry in enumerate(entries):
        srcs = _sources(entry)
        ids = [id_of.get(s) for s in srcs]
        if not srcs or all(i is None for i in ids):
            continue
        with_state = [i for i in ids if i is not None and i in opt.states]
        if None in ids:
            if with_state:
                raise PlanError(f"'{entry.target}' joins parameters with optimizer state and tensors without: "
                                f"their state cannot be joined; set training_state: drop", tensor=entry.target)
            continue
        groups = {group_of[i] for i in ids}  # type: ignore[index]
        if len(groups) > 1:
            raise PlanError(f"'{entry.target}' joins parameters of different param_groups "
                            f"({', '.join(str(g) for g in sorted(groups))}) of the optimizer {opt.label}: one "
                            "parameter has one group; set training_state: drop", tensor=entry.target)
        if with_state and len(with_state) != len(ids):
            raise PlanError(f"'{entry.target}' joins parameters with optimizer state and parameters without "
                            "(never stepped): their state cannot be joined; set training_state: drop",
                            tensor=entry.target)
        # the name relative to the model, as the optimizer names its parameters: the prefix's own parts
        # are cut even when a rename moved the whole model (`^model\.` -> `net.`, one dict renamed)
        rel = entry.target[len(prefix):] if entry.target.startswith(prefix) else entry.target.split(".", depth)[-1]
        kept.append((n, groups.pop(), ids, rel))  # type: ignore[arg-type]
        used.update(ids)  # type: ignore[arg-type]
    new_of, params_order, state_order = output_order(opt, kept, by_name, order)
    new_ids: list[list[Key]] = [[] for _ in opt.groups]
    new_names: list[list[str]] = [[] for _ in opt.groups]
    for k_ in params_order:
        n, g, _, rel = kept[k_]
        new_ids[g].append(new_of[n])
        new_names[g].append(rel)
    state_of: dict[Key, Node] = {}
    zeroed: dict[str, list[str]] = {}  # a parameter with added rows -> its moments whose new rows are zeros
    for n, _, from_ids, _ in kept:
        entry = entries[n]
        new = new_of[n]
        out.owners.setdefault(opt.path, {})[new] = entry.target
        states = [opt.states[i] for i in from_ids if i in opt.states]
        if not states:
            continue
        one = Node("dict", tensors=True)
        for k in states[0].order:
            target = f"{base}{new}.{k}"
            if k in moment_keys and all(k in s.tensors and tensors[s.tensors[k]].shape == shape_of[opt.owner[s.key]]
                                        for s in states):
                e = planned[k][n]
                if e.tensor.dtype != tensors[states[0].tensors[k]].dtype:
                    raise PlanError(f"the recipe changes the dtype of '{entry.target}', and with it its optimizer "
                                    f"state '{k}': moments keep their own dtype; drop the dtype adapter or set "
                                    "training_state: drop", tensor=entry.target)
                # the entry was planned with the moments in their parameters' places: name the moments
                moments = ", ".join(s.tensors[k] for s in states)
                out.entries.append(PlanEntry(target, moments, e.tensor.renamed(target), e.source_tensor, e.ops,
                                             e.module, optimizer="followed"))
                if any(text.startswith(_new_rows()) for text in e.ops):
                    zeroed.setdefault(entry.target, []).append(k)
                out.fates.append(_fate(opt, entry.target, k, "followed", target, moments))
                one.keys.append(k)
                one.values.append(TensorSlot(target))
                continue
            value = _scalar(opt, states, k, entry.target, tensors, shape_of, len(from_ids), entry.ops)
            if isinstance(value, LazyTensor):
                # its own storage: the outputs of a split each get a copy, and torch steps each in place
                # (`step += 1`), so one storage shared by three would count three steps
                own = value.derived(dtype=value.dtype, shape=value.shape, loader=value.loader)
                out.entries.append(PlanEntry(target, value.name, own.renamed(target), value, ("copied",),
                                             optimizer="copied"))
                one.keys.append(k)
                one.values.append(TensorSlot(target))
            else:
                one.keys.append(k)
                one.values.append(value)
            out.fates.append(_fate(opt, entry.target, k, "copied", target,
                                   ", ".join(s.tensors.get(k, f"{base}{s.key}.{k}") for s in states)))
        state_of[new] = one
    state = Node("dict", tensors=True)
    for k_ in state_order:
        new = new_of[kept[k_][0]]
        if new in state_of:
            state.keys.append(new)
            state.values.append(state_of[new])
    for i, ps in opt.states.items():
        if i not in used:
            for k in ps.order:
                out.fates.append(_fate(opt, opt.owner[i], k, "dropped", ps.tensors.get(k)))
    dropped = [opt.owner[i] for g in opt.params for i in g if i not in used]
    out.swap[opt.path] = (_rebuilt(opt, state, new_ids, new_names, by_name), opt.slots)
    said = f"optimizer {opt.label}: state matched to parameters by {opt.rule}; followed the recipe"
    if dropped:
        said += f"; dropped the state of {len(dropped)} parameters the recipe drops ({', '.join(dropped[:5])}" + (
            ", ...)" if len(dropped) > 5 else ")")
    out.notes.append(said)
    for param, keys in zeroed.items():
        out.notes.append(f"optimizer {opt.label}: the values the recipe makes in '{param}' (added rows, or a new "
                         f"tensor) start with zero {', '.join(keys)}: they have no history; the rest keeps its own")


def _fate(opt: Optimizer, param: str, key: str, fate: str, tensor: str | None,
          source: str | None = None) -> dict[str, Any]:
    """One state value's fate: `param` the parameter it belongs to (its output name unless dropped),
    `tensor` where it goes (or, dropped, where it was), `from` the state it is made from."""
    return {"optimizer": opt.path, "param": param, "state": key, "fate": fate, "tensor": tensor,
            "from": source if source is not None else tensor}


# steps after which a parameter holds the same numbers in the same layout (renames: a remap, renumbered
# indices, an adapter's gamma/beta; a cast): its other state still fits it. A recipe op says so itself
# (`Op.keeps_layout`); its ops text starts with its name.
_KEEPS_LAYOUT = ("remap ", "index ", "rename ", "cast ")


def _keeps_layout() -> tuple[str, ...]:
    from ..ops.base import OPS

    return _KEEPS_LAYOUT + tuple(f"{name} " for name, op in OPS.items() if op.keeps_layout)


def _new_rows() -> tuple[str, ...]:
    """The ops texts of the ops that add rows (`Op.new_rows`): their moments' new rows are zeros."""
    from ..ops.base import OPS

    return tuple(f"{name} " for name, op in OPS.items() if op.new_rows)


def _scalar(opt: Optimizer, states: Sequence[ParamState], k: str, target: str, tensors: dict[str, LazyTensor],
            shape_of: dict[str, tuple[int, ...]], inputs: int, ops: Sequence[str] = ()) -> Any:
    """A state value that is not shaped like its parameter: the one input's, or the inputs' common value.
    State of another shape (Adafactor's factored row_var/col_var) is copied when the parameter is only
    renamed or cast, so the numbers it describes are where they were; any other op refuses it."""
    values: list[Any] = []
    for s in states:
        if k in s.tensors:
            t = tensors[s.tensors[k]]
            if t.numel != 1 and inputs == 1 and t.shape != shape_of[opt.owner[s.key]]:
                kept = _keeps_layout()
                changed = [op for op in ops if not op.startswith(kept)]
                if changed:
                    raise PlanError(f"optimizer state '{s.tensors[k]}' (shape {list(t.shape)}) is neither shaped like "
                                    f"its parameter nor a scalar, and '{target}' goes through {changed[0]}: such "
                                    "state (Adafactor's factored moments, ...) follows only a renamed or cast "
                                    "parameter; set training_state: drop", tensor=s.tensors[k])
            if t.numel != 1 and inputs > 1:
                raise PlanError(f"'{target}' joins parameters whose optimizer state '{k}' is not shaped like them: "
                                "it cannot be joined; set training_state: drop", tensor=target)
            values.append(t)
        elif k in s.plain:
            values.append(s.plain[k])
        else:
            raise PlanError(f"'{target}' joins parameters of which only some have optimizer state '{k}'; set "
                            "training_state: drop", tensor=target)
    first = values[0]
    for v in values[1:]:
        if not _same(first, v):
            raise PlanError(f"'{target}' joins parameters whose optimizer state '{k}' differs ({_shown(first)} and "
                            f"{_shown(v)}): one parameter has one value; set training_state: drop", tensor=target)
    return first


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, LazyTensor) and isinstance(b, LazyTensor):
        return a.dtype == b.dtype and a.shape == b.shape and bytes(a.data()) == bytes(b.data())
    if isinstance(a, LazyTensor) or isinstance(b, LazyTensor):
        return False
    return type(a) is type(b) and a == b


def _shown(v: Any) -> str:
    if isinstance(v, LazyTensor):
        try:
            return repr(v.numpy().reshape(-1)[0].item())
        except Exception:  # only for the message: any failure shows the name
            return v.name
    return repr(v)


def _rebuilt(opt: Optimizer, state: Node, ids: list[list[Key]], names: list[list[str]], by_name: bool) -> Node:
    """The optimizer's dict with the new state and groups; every other value as it was. A group of
    integer ids gets `param_names` when it had none (first, where torch's `state_dict` puts them): torch
    loads ids by position, so the names are what a resume builds the new optimizer's groups from. Ids
    that are names (DCP) name their parameters already, as `dcp_to_torch_save` writes them."""
    from ..formats.pytorch.tree import Node

    groups_old = opt.node.values[opt.node.keys.index("param_groups")]
    assert isinstance(groups_old, Node)
    groups = Node(groups_old.kind)
    for g, old in enumerate(opt.groups):
        new = Node(old.kind, attrs=old.attrs)
        if not by_name and "param_names" not in old.keys:
            new.keys.append("param_names")
            new.values.append(Node("list", values=list(names[g])))
        for k, v in zip(old.keys, old.values, strict=True):
            if k == "params":
                v = Node("list", values=list(ids[g]))
            elif k == "param_names":
                v = Node("list", values=list(names[g]))
            new.keys.append(k)
            new.values.append(v)
        groups.values.append(new)
    node = Node(opt.node.kind, attrs=opt.node.attrs, tensors=True)
    for k, v in zip(opt.node.keys, opt.node.values, strict=True):
        if k == "state":
            v = state
        elif k == "param_groups":
            v = groups
        elif isinstance(v, Node) and v.tensors:
            raise PlanError(f"the optimizer {opt.label} holds tensors outside its state ('{k}'): they cannot "
                            "follow the recipe; set training_state: drop")
        node.keys.append(k)
        node.values.append(v)
    return node


# ---------------------------------------------------------------------------------------------------
# the plan's side: keep or drop, and for what


@dataclass
class Training:
    """What a plan does with a checkpoint's training state: `model` the tensors the recipe plans (None:
    the reader's), the optimizers to follow, and what following made."""

    mode: str = "drop"
    model: list[LazyTensor] | None = None
    prefix: str = ""  # where the model sits when `top_level_key` chose it in a whole checkpoint
    passthrough: list[LazyTensor] = field(default_factory=list)  # tensors beside the model and optimizers
    optimizers: list[Optimizer] = field(default_factory=list)
    swap: dict[str, tuple[Node | None, int]] = field(default_factory=dict)
    fates: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    burn: bool = False  # a PyTorch optimizer into a burnpack: its state becomes Burn's OptimizerRecord
    trainer: bool = False  # a Trainer checkpoint into a Trainer folder, optimizer.pt beside the model
    as_names: bool = False  # the target keys every optimizer by its parameters' names (DCP)
    owners: dict[str, dict[Key, str]] = field(default_factory=dict)  # `Followed.owners`

    def follow(self, reader: Any, entries: Sequence[PlanEntry], replan: Replan, fatal: list[str],
               order: Sequence[str] | None = None) -> list[PlanEntry]:
        """The optimizers' entries, after the model's `entries` were planned; problems go to `fatal`.
        `order`: the new model's parameter names in its own order (`target.param_order`)."""
        assert self.model is not None
        by_name = {t.name: t for t in reader.tensors}
        shapes = {t.name: t.shape for t in self.model}
        container = model_dict(reader.structure, list(shapes))
        for opt in self.optimizers:
            opt.name_ids = not is_format(reader.format, param_ids_by_name=False)
            opt.as_names = self.as_names
            try:
                identify(opt, [t.name for t in self.model], reader.label, container=container)
                check_state_shapes(opt, shapes, {n: by_name[n].shape for n in opt.tensor_names}, HINT)
            except PlanError as e:
                fatal.append(str(e))
                return []
        done = follow(self.optimizers, self.model, by_name, entries, replan, order=order)
        fatal += done.fatal
        self.swap.update(done.swap)
        self.fates += done.fates
        self.notes += done.notes
        if not self.burn:
            self.notes += [resume_note(opt) for opt in self.optimizers]
        self.owners.update(done.owners)
        return done.entries

    def placed(self, entries: Sequence[PlanEntry]) -> list[PlanEntry]:
        """The plan's entries named as in the whole checkpoint: the model's under `prefix`, then the
        tensors beside it, unchanged."""
        from dataclasses import replace

        # a burnpack or a Trainer folder: the model's names, flat
        if self.burn or self.trainer or (not self.prefix and not self.passthrough):
            return list(entries)
        p = self.prefix
        out = [e if e.optimizer is not None else replace(
            e, target=p + e.target, tensor=e.tensor.renamed(p + e.target),
            source=None if e.source is None else ", ".join(p + s for s in e.source.split(", ")))
            for e in entries]
        out += [PlanEntry(t.name, t.name, t, t) for t in self.passthrough]
        return out


def training_state(recipe: Any, reader: Any, out_fmt: str, tpl_path: Any, fatal: list[str],
                   model_key: str | None = None) -> Training:
    """Keep or drop the optimizers of a whole PyTorch checkpoint (`training_state`; by default kept when
    the run keeps the checkpoint's structure: one PyTorch file from a whole checkpoint; into one burnpack
    only when asked, as Burn's optimizer record: `Training.burn`), and which tensors the recipe then plans
    (the model's: not the optimizers'). `model_key`: the dotted `source.top_level_key` of a `keep` run,
    whose source was opened whole: the recipe plans the tensors under it (named without it); every
    tensor outside it and the optimizers passes through (into a .pt; a burnpack leaves them out)."""
    from ..ops.base import entry_op

    tree = reader.structure
    one_file = tree is not None and recipe.target.shard is None and tpl_path is None
    whole = one_file and is_format(out_fmt, keeps_structure=True)
    mode = recipe.training_state or ("keep" if whole else "drop")
    out = Training(mode, as_names=is_format(out_fmt, optimizer_by_name=True))
    if mode == "keep" and one_file and is_format(out_fmt, for_burn=True):
        # a whole PyTorch checkpoint into Burn: the model into the burnpack, each optimizer's state into
        # Burn's OptimizerRecord beside it (`plan.burn_optimizer`); asked for only, never by default
        whole = out.burn = True
    if (mode == "keep" and is_format(reader.format, trainer_folder=True) and recipe.target.shard is not None
            and tpl_path is None):
        whole = out.trainer = True  # a Trainer folder: the model's files and optimizer.pt (`plan.trainer_target`)
    if mode == "keep" and is_format(out_fmt, for_burn=True) and is_format(reader.format, for_burn=True):
        # Burn's training state in a burnpack is each parameter's ParamId (its OptimizerRecord, keyed by
        # them, is a file of its own): renames keep the ids, an op's outputs are new parameters
        out.notes.append("training_state: keep: every tensor keeps its param_id through renames and adapters, so "
                         "Burn's optimizer record (keyed by ParamId) still finds it; outputs of ops are new "
                         "parameters, with no param_id (Burn mints one)")
        return out
    if mode == "keep" and not whole:
        if recipe.training_state == "keep":
            fatal.append(_why_not_whole(recipe, reader, out_fmt, tpl_path))
        return out
    if not whole:
        return out
    optimizers = find_optimizers(tree, reader.names(), reader.label)
    inside = {n for opt in optimizers for n in opt.tensor_names}
    if model_key is not None:
        out.prefix = model_key + "."
        out.model = [t.renamed(t.name[len(out.prefix):]) for t in reader.tensors
                     if t.name.startswith(out.prefix) and t.name not in inside]
        out.passthrough = [t for t in reader.tensors if not t.name.startswith(out.prefix) and t.name not in inside]
        if out.burn and out.passthrough:  # a burnpack holds one model: what sits beside it has no place
            shown = ", ".join(t.name for t in out.passthrough[:5]) + (", ..." if len(out.passthrough) > 5 else "")
            out.notes.append(f"{count(len(out.passthrough), 'tensor')} outside '{model_key}' and the optimizers not "
                             f"written (a burnpack holds the model): {shown}")
            out.passthrough = []
        if not out.model:
            fatal.append(f"source.top_level_key '{model_key}' selects no tensor outside the optimizers in "
                         f"{reader.label}")
            return out
    if not optimizers:
        return out
    if out.model is None:
        out.model = [t for t in reader.tensors if t.name not in inside]
        said = _patterns_on_optimizers(recipe, [t.name for t in reader.tensors if t.name in inside])
        if said == "all" and mode == "keep":  # the filter leaves every optimizer tensor out: the old way to drop
            out.notes.append(f"optimizer state dropped ({_paths(optimizers)}): the recipe's filter leaves out every "
                             "tensor in it (training_state: drop says so directly)")
            mode = out.mode = "drop"
        elif said and said != "all":
            fatal.append(f"{said}: a whole-checkpoint run keeps the optimizer state, and it follows its parameters "
                         "(training_state: keep); the recipe's remaps and filter apply to the model's tensors. Set "
                         "training_state: drop to leave the optimizer out")
            return out
    computed = sorted({op.name for op, _ in map(entry_op, recipe.ops) if op.computes})
    if mode == "keep" and (computed or any(s.lora is not None for s in recipe.inputs())):
        what = f"computed ops ({', '.join(computed)})" if computed else "a LoRA folded into the source"
        out.notes.append(f"optimizer state dropped ({_paths(optimizers)}): {what} make new weights, which stale "
                         "moments would not fit; training resumes with a fresh optimizer")
        mode = out.mode = "drop"
    elif mode == "drop":
        out.notes.append(f"optimizer state dropped ({_paths(optimizers)}): training_state: drop")
    if mode == "drop":
        for opt in optimizers:
            out.swap[opt.path] = (None, opt.slots)
            for i, ps in opt.states.items():
                out.fates += [_fate(opt, str(i), k, "dropped", ps.tensors.get(k)) for k in ps.order]
        return out
    out.optimizers = optimizers
    return out


def _patterns_on_optimizers(recipe: Any, names: Sequence[str]) -> str | None:
    """Whether the recipe's remaps or filter touch the optimizers' own tensors (`names`): "all" when the
    filter leaves every one out and no remap renames one, else what touches the first one, or None."""
    from ..naming import KeyRemapper, NameFilter, RemapRule

    if not names:
        return None
    if recipe.remap:
        remapper = KeyRemapper([RemapRule(r.from_, r.to, r.syntax) for r in recipe.remap])
        renamed = next((n for n in names if remapper.remap_name(n) != n), None)
        if renamed is not None:
            return f"a remap renames the optimizer's own tensor '{renamed}'"
    include = NameFilter(recipe.filter.include) if recipe.filter.include is not None else None
    exclude = NameFilter(recipe.filter.exclude) if recipe.filter.exclude else None
    out = [n for n in names if (include is not None and not include(n)) or (exclude is not None and exclude(n))]
    if not out:
        return None
    return "all" if len(out) == len(names) else f"the filter leaves out the optimizer's own tensor '{out[0]}'"


def _paths(optimizers: Sequence[Optimizer]) -> str:
    return ", ".join(o.path or "the top level" for o in optimizers)


def _why_not_whole(recipe: Any, reader: Any, out_fmt: str, tpl_path: Any) -> str:
    if is_format(out_fmt, for_burn=True) and (recipe.target.shard is not None or tpl_path is not None):
        return ("training_state: keep into burnpack writes the model into one .bpk and the optimizer into Burn's "
                "OptimizerRecord beside it: a template or shards are not supported with it (drop them, or set "
                "training_state: drop)")
    if is_format(out_fmt, for_burn=True):
        return (f"training_state: keep into burnpack needs a whole PyTorch training checkpoint (model and optimizer) "
                f"or a burnpack as its source; {reader.label} ({reader.format}) has no optimizer to keep (set "
                "training_state: drop; target.scalars writes epoch or step as typed scalars)")
    if not is_format(out_fmt, keeps_structure=True):
        return (f"training_state: keep writes the whole checkpoint as PyTorch (.pt); this target is {out_fmt}, which "
                "has no place for an optimizer (write a .pt or a DCP target, or set training_state: drop)")
    if recipe.target.shard is not None or tpl_path is not None:
        return ("training_state: keep writes the whole checkpoint into one file: a template or shards write a flat "
                "state_dict (drop them, or set training_state: drop)")
    if recipe.sources is not None:
        return ("training_state: keep needs one source (a whole training checkpoint); this recipe has sources: "
                "(set training_state: drop)")
    return (f"training_state: keep needs a whole PyTorch checkpoint as its source; {reader.label} has no "
            "structure to keep (set training_state: drop)")

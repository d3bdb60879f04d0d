"""A ZeRO checkpoint's optimizer state, consolidated per parameter, and the whole checkpoint it makes.

Beside each flat fp32 partition, every rank's optimizer file holds the base optimizer's state of that
partition, as the torch optimizer keeps it for one flat parameter:

* ZeRO-1/2: `optimizer_state_dict.base_optimizer_state` is the base optimizer's `state_dict()`, one
  "parameter" per group (`param_groups[g].params == [g]`); each state tensor (`exp_avg`, `exp_avg_sq`)
  is as long as the rank's partition *with* its padding (`group_paddings[g]`), which the saved fp32
  partition has without. An elastic checkpoint saves a list per group instead, without the
  optimizer's hyperparameters: refused here.
* ZeRO-3: `optimizer_state_dict.optimizer_state_dict` is the base optimizer's `state_dict()`, one
  "parameter" per sub-group (`fp32_flat_groups[i]`), each param group listing its sub-groups; the
  state tensors are as long as the flat partition.

The elements of a state tensor line up with those of the fp32 partition (the padding is at the end),
so a parameter's moment is made of the very pieces its fp32 master is (`partitions.Piece`), read
from the moment's own byte ranges. Plain values (`step`) must agree across ranks, as DeepSpeed's
`ds_to_universal` asserts; a scalar tensor is taken from rank 0.

`whole_tree` lays it out as a whole PyTorch checkpoint for a `.pt` target with `training_state: keep`:
`{"model": {name: fp32}, "optimizer": {"state": {name: {"step", "exp_avg", "exp_avg_sq"}},
"param_groups": [{hyperparameters..., "params": [names], "param_names": [names]}]}}`: keyed by
parameter names, so the plan matches state to parameters by name (`plan.training_state`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.dtypes import Kind
from ...core.errors import FormatError
from ...core.tensor import LazyTensor
from ..pytorch.tree import SOURCE_SLOT, CheckpointTree, Node
from .partitions import Piece, RankFiles, Span, gathered
from .states import StateFile

MODEL, OPTIMIZER = "model", "optimizer"
"""The whole checkpoint's top-level keys."""


@dataclass
class _Key:
    """One state key of one flat partition: a partition on every rank (`parts[rank]`: tensor, file
    index, data offset), a scalar tensor (rank 0's), or a plain value equal on every rank."""

    kind: str  # "partition", "scalar" or "plain"
    parts: list[tuple[LazyTensor, int, int]] = field(default_factory=list)
    value: Any = None


@dataclass
class ZeroOptimizer:
    """Per param group its hyperparameters (`groups`, as stored, without `params`) and its parameters'
    names (`names`); per parameter its state (`state[name]`: key -> lazy tensor or plain value, in the
    order stored)."""

    groups: list[dict[str, Any]]
    names: list[list[str]]
    state: dict[str, dict[str, Any]]

    def tensors(self) -> list[LazyTensor]:
        return [v for per in self.state.values() for v in per.values() if isinstance(v, LazyTensor)]


def _base(state: StateFile, stage: int) -> tuple[Any, Any, str]:
    """The base optimizer's `state` and `param_groups`, and where they are (for messages)."""
    osd = state.at(state.root, "optimizer_state_dict")
    where = "optimizer_state_dict." + ("base_optimizer_state" if stage <= 2 else "optimizer_state_dict")
    base = state.at(osd, where.split(".", 1)[1])
    if isinstance(base, (list, tuple)):
        raise state.bad(f"{where} is a list per group (an elastic checkpoint): it holds no param_groups, so the "
                        "optimizer's hyperparameters are not saved; save with zero_optimization.elastic_checkpoint "
                        "false, or set training_state: drop")
    st, groups = state.at(base, "state"), state.at(base, "param_groups")
    if not isinstance(st, dict) or not isinstance(groups, (list, tuple)):
        raise state.bad(f"{where} is not an optimizer state_dict (state and param_groups)")
    return st, groups, where


MAX_HYPER_DEPTH = 32
"""Containers nested in one hyperparameter (torch's are flat: betas is a tuple of two)."""


def _depth(value: Any) -> int:
    """How deep containers nest in `value`, found without recursion (a pickle may nest them 1,000 deep);
    a container shared by memo is walked again only when met deeper, so shared ones cost no 2^depth."""
    most, todo = 0, [(value, 0)]
    seen: dict[int, int] = {}
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list, tuple)) and seen.get(id(v), -1) < d:
            seen[id(v)] = d
            most = max(most, d + 1)
            if most > MAX_HYPER_DEPTH:
                return most
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return most


def _plain(value: Any) -> bool:
    return value is None or type(value) in (bool, int, float, str)


def read_optimizer(stage: int, ranks: Sequence[StateFile], flats: Sequence[Sequence[tuple[LazyTensor, int, int]]],
                   shapes: Sequence[dict[str, tuple[int, ...]]], pieces: dict[str, list[Piece]], files: RankFiles,
                   label: str) -> ZeroOptimizer:
    """Each trained parameter's optimizer state (`flats[rank][i]`: the fp32 partitions as the masters
    were read, `shapes` param_shapes as listed, `pieces` each parameter's pieces of them)."""
    first = ranks[0]
    st0, groups, where = _base(first, stage)
    ids: list[Any] = []
    group_of: list[int] = []
    hypers: list[dict[str, Any]] = []
    for g, group in enumerate(groups):
        if not isinstance(group, dict) or not isinstance(group.get("params"), (list, tuple)):
            raise first.bad(f"{where}.param_groups[{g}] is not a param group (a dict with params)")
        for pid in group["params"]:  # torch's ids are ints (names with param_names): anything else has no key
            if not (type(pid) is str or (type(pid) is int and 0 <= pid < 1 << 63)):
                shown = f"an integer of {pid.bit_length()} bits" if type(pid) is int else type(pid).__name__
                raise first.bad(f"{where}.param_groups[{g}].params holds {shown}, not a parameter id")
        ids += list(group["params"])
        group_of += [g] * len(group["params"])
        hypers.append({k: v for k, v in group.items() if k != "params"})
        if _depth(group) > MAX_HYPER_DEPTH:  # the tree and its writer walk it by recursion: refused first
            raise first.bad(f"{where}.param_groups[{g}] holds a hyperparameter nested deeper than {MAX_HYPER_DEPTH} "
                            "levels")
    count = len(flats[0])
    if len(ids) != count:
        raise first.bad(f"{where}.param_groups list {len(ids)} flat parameters but the rank holds {count} fp32 "
                        "partitions")
    keys: list[dict[str, _Key]] = [{} for _ in range(count)]
    for r, state in enumerate(ranks):
        st = st0 if r == 0 else _base(state, stage)[0]
        pads = [0] * count
        if stage <= 2:
            osd = state.at(state.root, "optimizer_state_dict")
            pads = state.ints(state.at(osd, "group_paddings"), "group_paddings")
            if len(pads) != count:
                raise state.bad(f"group_paddings lists {len(pads)} groups but the rank holds {count} partitions")
        listed = set(ids)
        stray = next((k for k in st if type(k) not in (int, str) or k not in listed), None)
        if stray is not None:  # torch's load_state_dict refuses such state too: it would be dropped silently
            shown = repr(stray) if type(stray) in (int, str) and len(repr(stray)) <= 40 else type(stray).__name__
            raise state.bad(f"{where}.state has an entry {shown} that no param group lists")
        for i in range(count):
            if (ids[i] in st) != (ids[i] in st0):  # no entry: not stepped yet (a save before the first step)
                raise state.bad(f"{where}.state {'has no' if ids[i] not in st else 'has an'} entry {ids[i]!r} for "
                                f"flat partition {i}, but rank 0's {'has' if ids[i] in st0 else 'has none'}")
            if ids[i] not in st:
                continue
            entry = st[ids[i]]
            if not isinstance(entry, dict):
                raise state.bad(f"{where}.state[{ids[i]!r}] is not a dict of optimizer state")
            if r and set(entry) != set(keys[i]):
                raise state.bad(f"{where}.state[{ids[i]!r}] holds {sorted(map(str, entry))} but rank 0's holds "
                                f"{sorted(map(str, keys[i]))}")
            fp32, index, _ = flats[r][i]
            want = fp32.shape[0] + pads[i]
            for k, v in entry.items():
                if type(k) is not str:
                    raise state.bad(f"{where}.state[{ids[i]!r}] has a key that is not a name")
                _add_key(state, keys[i], r, index, k, v, (want, fp32.shape[0], pads[i]),
                         f"{where}.state[{ids[i]!r}]['{k}']")
    return _per_parameter(keys, group_of, hypers, shapes, pieces, files, label)


def _add_key(state: StateFile, keys: dict[str, _Key], rank: int, index: int, k: str, v: Any,
             sizes: tuple[int, int, int], what: str) -> None:
    """Key `k` of one flat partition's state on `rank` (whose file is `index` in the `RankFiles`);
    `sizes`: the length a state tensor must have, the fp32 partition's, its padding."""
    want, lean, pad = sizes
    if state.is_tensor(v):
        t = state.tensor_of(v, what)
        if t.numel == want and len(t.shape) == 1 and t.dtype.kind is Kind.FLOAT:
            kind = "partition"
        elif not t.shape:  # a 0-d tensor (torch's own AdamW keeps `step` so): one value for the partition
            kind = "scalar"
        else:
            raise state.bad(f"{what} holds {t.numel} elements (shape {list(t.shape)}), but its fp32 partition holds "
                            f"{want} ({lean} + {pad} padding): the optimizer state does not match the partition")
        known = keys.get(k) if rank else None
        if rank and (known is None or known.kind != kind):
            raise state.bad(f"{what} is a {kind} here but not on rank 0")
        if rank == 0:
            known = keys[k] = _Key(kind)
        assert known is not None
        if kind == "partition" or rank == 0:
            known.parts.append((t, index, state.data_offset(t, what)))
        return
    if not _plain(v):
        raise state.bad(f"{what} is neither a tensor nor a number")
    if type(v) is int and not -(1 << 63) <= v < 1 << 63:  # torch's steps are int64 (or floats)
        raise state.bad(f"{what} is an integer of {v.bit_length()} bits, beyond 64")
    if rank == 0:
        keys[k] = _Key("plain", value=v)
    elif keys[k].kind != "plain" or not _same(keys[k].value, v):
        raise state.bad(f"{what} is {v!r} here but {keys[k].value!r} on rank 0: the ranks disagree")


def _same(a: Any, b: Any) -> bool:
    """Equal plain values, a NaN equal to a NaN (a NaN step on every rank is one value, not a disagreement)."""
    return a == b or (type(a) is float and type(b) is float and a != a and b != b)


def _per_parameter(keys: list[dict[str, _Key]], group_of: list[int], hypers: list[dict[str, Any]],
                   shapes: Sequence[dict[str, tuple[int, ...]]], pieces: dict[str, list[Piece]], files: RankFiles,
                   label: str) -> ZeroOptimizer:
    names: list[list[str]] = [[] for _ in hypers]
    state: dict[str, dict[str, Any]] = {}
    for j, group in enumerate(shapes):
        for name, shape in group.items():
            ps = pieces[name]
            flat_ids = sorted({p.group for p in ps}) or [min(j, len(keys) - 1)]
            g = group_of[flat_ids[0]]
            if any(group_of[i] != g for i in flat_ids):
                raise FormatError("its pieces lie in flat partitions of different param groups", file=label,
                                  tensor=name)
            names[g].append(name)
            if not any(keys[i] for i in flat_ids):  # never stepped: no state, as torch saves such a parameter
                continue
            per: dict[str, Any] = {}
            for k, key in keys[flat_ids[0]].items():
                if any(keys[i].get(k) is None or keys[i][k].kind != key.kind for i in flat_ids):
                    raise FormatError(f"optimizer state '{k}' differs between the flat partitions it spans", file=label,
                                      tensor=name)
                full = f"{OPTIMIZER}.state.{name}.{k}"
                if key.kind == "plain":
                    per[k] = key.value
                elif key.kind == "scalar":
                    t, index, offset = key.parts[0]
                    per[k] = gathered(full, t.dtype, t.shape, files, [Span(index, offset, t.nbytes)], label)
                else:
                    per[k] = _moment(full, shape, ps, {i: keys[i][k] for i in flat_ids}, files, label)
            state[name] = per
    return ZeroOptimizer(hypers, names, state)


def _moment(full: str, shape: tuple[int, ...], pieces: Sequence[Piece], per_flat: dict[int, _Key], files: RankFiles,
            label: str) -> LazyTensor:
    """A parameter's state tensor: its pieces, read from that state's partitions (`per_flat[flat]`)."""
    dtypes = {per_flat[p.group].parts[p.rank][0].dtype for p in pieces}
    if len(dtypes) > 1:
        raise FormatError("its partitions are of several dtypes", file=label, tensor=full)
    dtype = dtypes.pop() if dtypes else next(iter(per_flat.values())).parts[0][0].dtype
    size = dtype.itemsize or 4
    spans = []
    for p in pieces:
        _, index, offset = per_flat[p.group].parts[p.rank]
        spans.append(Span(index, offset + p.start * size, p.count * size))
    return gathered(full, dtype, shape, files, spans, label)


# ---------------------------------------------------------------------------------------------------
# the whole checkpoint, and what inspect says




def _node(value: Any, tree: CheckpointTree, path: str, depth: int = 0) -> Any:
    """A hyperparameter as the tree holds it: plain values as themselves, containers as Nodes; anything
    else (a DeepSpeed object) is listed as dropped."""
    if depth > MAX_HYPER_DEPTH:  # walked by recursion, as the writer walks it: refused before either overflows
        raise FormatError(f"hyperparameter {path[:200]} is nested deeper than {MAX_HYPER_DEPTH} levels")
    if _plain(value):
        tree.kept_count += 1
        return value
    if isinstance(value, (dict, list, tuple)):
        kind = "dict" if isinstance(value, dict) else "list" if isinstance(value, list) else "tuple"
        node = Node(kind)  # type: ignore[arg-type]
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            if isinstance(value, dict) and type(k) not in (str, int):
                continue
            inner = _node(v, tree, f"{path}.{k}", depth + 1)
            if inner is _DROPPED:
                continue
            if node.is_dict:
                node.keys.append(k)
            node.values.append(inner)
        return node
    tree.dropped_count += 1
    tree.dropped.append(path)
    return _DROPPED


_DROPPED = object()


def whole_tree(model: Sequence[str], opt: ZeroOptimizer) -> CheckpointTree:
    """`{"model": ..., "optimizer": {"state": ..., "param_groups": ...}}`, its tensor slots in the order
    `model` (the fp32 view's names) then `opt.tensors()`."""
    tree = CheckpointTree(Node("dict"))
    weights = Node("dict", keys=[None] * len(model), values=[SOURCE_SLOT] * len(model), tensors=bool(model))
    state = Node("dict")
    for name, per in opt.state.items():
        one = Node("dict")
        for k, v in per.items():
            if isinstance(v, LazyTensor):
                one.keys.append(None)
                one.values.append(SOURCE_SLOT)
                one.tensors = True
            else:
                one.keys.append(k)
                one.values.append(v)
                tree.kept_count += 1
        state.keys.append(name)
        state.values.append(one)
        state.tensors = state.tensors or one.tensors
    groups = Node("list")
    for g, (hyper, names) in enumerate(zip(opt.groups, opt.names, strict=True)):
        group = _node(hyper, tree, f"{OPTIMIZER}.param_groups.{g}")
        assert isinstance(group, Node)
        group.keys += ["params", "param_names"]
        group.values += [Node("list", values=list(names)), Node("list", values=list(names))]
        groups.values.append(group)
    tree.kept.append(f"{OPTIMIZER}.param_groups")
    optimizer = Node("dict", keys=["state", "param_groups"], values=[state, groups], tensors=state.tensors)
    tree.root.tensors = weights.tensors or state.tensors
    tree.root.keys += [MODEL, OPTIMIZER]
    tree.root.values += [weights, optimizer]
    return tree


def describe(first: StateFile, stage: int) -> dict[str, Any] | None:
    """What rank 0's file says of the optimizer, for inspect (None when it is not an optimizer
    state_dict: nothing is refused here, as the fp32 masters do not need it)."""
    try:
        st, groups, where = _base(first, stage)
    except FormatError:
        return None
    keys: dict[str, None] = {}
    steps: list[Any] = []
    for entry in st.values():
        if isinstance(entry, dict):
            keys.update(dict.fromkeys(str(k) for k in entry))
            step = entry.get("step")
            if type(step) in (int, float) and step not in steps:
                steps.append(step)
    hyper = [{k: v for k, v in g.items() if type(k) is str and k != "params" and (
        _plain(v) or (isinstance(v, (list, tuple)) and len(v) <= 64 and all(_plain(x) for x in v)))}
             for g in groups if isinstance(g, dict)]  # flat values only: a nested one is no hyperparameter to show
    return {"where": where, "state": list(keys), "step": steps[:10], "param_groups": hyper[:100]}

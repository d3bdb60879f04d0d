"""A checkpoint's optimizer state dicts, as found in its structure (`formats.pytorch.tree`), and which
parameter each id is: steps 1 and 2 of following a recipe (`training_state`).

An optimizer state dict is a dict with `state` and `param_groups`, wherever it sits (`find_optimizers`);
its ids point at the model's parameters by `param_names` in the groups, by being names themselves, or by
the model's tensor order when the counts agree exactly (`identify`), and nothing else: when none is
certain, it refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.errors import PlanError

if TYPE_CHECKING:
    from ..formats.pytorch.tree import CheckpointTree, Node
HINT = ("build the optimizer from model.named_parameters() (torch >= 2.6 saves param_names in param_groups), or "
        "save it with torch.distributed.checkpoint.state_dict.get_optimizer_state_dict (keyed by names), or set "
        "training_state: drop")

Key = int | str


@dataclass
class ParamState:
    """One parameter's optimizer state: tensors by state key (the reader's names), plain values."""

    key: Key
    tensors: dict[str, str] = field(default_factory=dict)
    plain: dict[str, Any] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the state keys as stored


@dataclass
class Optimizer:
    """An optimizer state dict found in the checkpoint."""

    path: str  # dotted, '' at the top level
    node: Node
    states: dict[Key, ParamState]
    groups: list[Node]
    params: list[list[Key]]  # per group, as stored
    param_names: list[list[str]] | None
    tensor_names: list[str]  # every reader tensor inside it
    slots: int = 0
    rule: str = ""
    file: str = ""  # the checkpoint's label, for errors
    prefix: str = ""  # before the names the optimizer gives its parameters (`model.` in a whole checkpoint)
    owner: dict[Key, str] = field(default_factory=dict)  # id -> the model tensor's reader name
    # ids that are names are written as names (DCP's, as dcp_to_torch_save does); a ZeRO folder's names
    # are the reader's own device to match state by name, written as torch numbers its ids
    name_ids: bool = True
    as_names: bool = False  # the target keys optimizers by name (DCP's `get_state_dict` layout), whatever the source

    @property
    def by_name(self) -> bool:
        """Whether the written ids are the parameters' names."""
        return self.as_names or (self.name_ids and all(type(i) is str for group in self.params for i in group))

    @property
    def label(self) -> str:
        return f"'{self.path}'" if self.path else "at the top level"


# ---------------------------------------------------------------------------------------------------
# finding the optimizers


def find_optimizers(tree: CheckpointTree, names: Sequence[str], label: str) -> list[Optimizer]:
    """Every dict with `state` and `param_groups` in the structure (`names`: the reader's tensor names,
    the k-th is the k-th tensor slot in walk order)."""
    from ..formats.pytorch.tree import Node, TensorSlot

    found: list[Optimizer] = []
    slots = iter(names)
    # walk as place_tensors does: only containers with tensors hold slots
    stack: list[tuple[Node, str, Any]] = [(tree.root, "", iter(tree.root.items()))]
    open_optim: list[tuple[int, Optimizer]] = []  # (stack depth, optimizer) being walked
    if _is_optimizer(tree.root):
        open_optim.append((0, _new_optimizer(tree.root, "", label)))
    while stack:
        _, path, it = stack[-1]
        for key, value in it:
            if isinstance(value, TensorSlot):
                name = next(slots, None)
                if name is None:
                    raise PlanError("the checkpoint's structure and its tensors disagree (a bug)", file=label)
                if open_optim:
                    open_optim[-1][1].tensor_names.append(name)
                continue
            if isinstance(value, Node) and value.tensors:
                child = f"{path}.{key}" if path else str(key)
                if _is_optimizer(value):
                    open_optim.append((len(stack), _new_optimizer(value, child, label)))
                stack.append((value, child, iter(value.items())))
                break
            if isinstance(value, Node) and _is_optimizer(value):  # an optimizer without tensors yet (SGD, no step)
                child = f"{path}.{key}" if path else str(key)
                opt = _new_optimizer(value, child, label)
                _read_state(opt, label)
                found.append(opt)
        else:
            stack.pop()
            if open_optim and open_optim[-1][0] == len(stack):
                opt = open_optim.pop()[1]
                opt.slots = len(opt.tensor_names)
                _read_state(opt, label)
                found.append(opt)
                if open_optim:  # nested optimizers: the outer one's tensors include the inner one's
                    open_optim[-1][1].tensor_names.extend(opt.tensor_names)
    return found


def _is_optimizer(node: Node) -> bool:
    if not node.is_dict:
        return False
    keys = {k for k in node.keys if type(k) is str}
    if not {"state", "param_groups"} <= keys:
        return False
    groups = node.values[node.keys.index("param_groups")]
    return isinstance(groups, type(node)) and groups.kind in ("list", "tuple")


def _new_optimizer(node: Node, path: str, label: str) -> Optimizer:
    from ..formats.pytorch.tree import Node as NodeType

    groups_node = node.values[node.keys.index("param_groups")]
    assert isinstance(groups_node, NodeType)
    groups: list[Node] = []
    params: list[list[Key]] = []
    names: list[list[str]] = []
    has_names = True
    where = f"{path}.param_groups" if path else "param_groups"
    for g, group in enumerate(groups_node.values):
        if not isinstance(group, NodeType) or not group.is_dict or group.tensors or "params" not in group.keys:
            raise PlanError(f"{where}[{g}] is not a param group (a dict of params and hyperparameters); set "
                            "training_state: drop", file=label)
        ids = group.values[group.keys.index("params")]
        if not isinstance(ids, NodeType) or not all(type(i) in (int, str) for i in ids.values):
            raise PlanError(f"{where}[{g}].params is not a list of parameter ids; set training_state: drop",
                            file=label)
        groups.append(group)
        params.append(list(ids.values))  # type: ignore[arg-type]
        if "param_names" not in group.keys:
            has_names = False
            continue
        pn = group.values[group.keys.index("param_names")]
        # names that do not pair one to one with the ids say nothing certain: never fall back to an order
        if not isinstance(pn, NodeType) or not all(type(n) is str for n in pn.values):
            raise PlanError(f"{where}[{g}].param_names is not a list of names; set training_state: drop", file=label)
        if len(pn.values) != len(ids.values):
            raise PlanError(f"{where}[{g}] lists {len(ids.values)} params but {len(pn.values)} param_names: which "
                            "state belongs to which parameter is not certain; set training_state: drop", file=label)
        names.append(list(pn.values))  # type: ignore[arg-type]
    state = node.values[node.keys.index("state")]
    if not isinstance(state, NodeType) or not state.is_dict:
        raise PlanError(f"{path + '.' if path else ''}state is not a dict of per-parameter state; set "
                        "training_state: drop", file=label)
    if names and not has_names:  # torch saves names for every group or for none
        raise PlanError(f"{where}: some param groups have param_names and some do not: which state belongs to which "
                        "parameter is not certain; set training_state: drop", file=label)
    return Optimizer(path, node, {}, groups, params, names if has_names and names else None, [], file=label)


def _read_state(opt: Optimizer, label: str) -> None:
    """Each parameter's state: its tensors (named as the reader names them) and plain values."""
    from ..formats.pytorch.tree import Node, TensorSlot

    state = opt.node.values[opt.node.keys.index("state")]
    assert isinstance(state, Node)
    base = f"{opt.path}.state." if opt.path else "state."
    names = iter(n for n in opt.tensor_names if n.startswith(base))
    for key, value in zip(state.keys, state.values, strict=True):
        if key is None:  # a tensor directly under state: not per-parameter state
            raise PlanError(f"{base}... holds a tensor where a parameter's state dict belongs; set "
                            "training_state: drop", file=label)
        if not isinstance(value, Node) or not value.is_dict:
            raise PlanError(f"{base}{key} is not a state dict; set training_state: drop", file=label)
        ps = ParamState(key)
        prefix = f"{base}{key}."
        for k, v in zip(value.keys, value.values, strict=True):
            if isinstance(v, TensorSlot):
                name = next(names, None)
                if name is None or not name.startswith(prefix):
                    raise PlanError("the optimizer's structure and its tensors disagree (a bug)", file=label)
                sk = name[len(prefix):] if k is None else str(k)
                ps.tensors[sk] = name
                ps.order.append(sk)
            elif isinstance(v, Node):
                raise PlanError(f"{prefix}{k} is a container: optimizer state that follows a recipe is tensors and "
                                "numbers; set training_state: drop", file=label, tensor=f"{prefix}{k}")
            else:
                ps.plain[str(k)] = v
                ps.order.append(str(k))
        opt.states[key] = ps


# ---------------------------------------------------------------------------------------------------
# which parameter each id is


def identify(opt: Optimizer, model: Sequence[str], label: str, prefix: str | None = None,
             container: str | None = None) -> None:
    """Fill `opt.owner` (id -> model tensor name) and `opt.rule`, or raise naming why none is certain.
    `model`: the model's tensor names as the reader names them; `prefix` (with its dot): where the model
    is, when known (`source.top_level_key`); `container` (with its dot): the top-level dict holding
    every model tensor, if one does (`model_dict`), whose key the order rule's names leave out."""
    known = set(model)
    ids = [i for group in opt.params for i in group]
    if len(set(ids)) != len(ids):
        raise PlanError(f"the optimizer {opt.label} lists a parameter id twice in its param_groups", file=label)
    if opt.param_names is not None or all(type(i) is str for i in ids):
        by_name = [n for group in opt.param_names for n in group] if opt.param_names is not None else [
            str(i) for i in ids]
        found = _model_prefix(by_name, model, known, prefix)
        if found is None:
            missing = next(n for n in by_name if not any(f"{p}{n}" in known for p in _prefixes(model, prefix)))
            raise PlanError(f"the optimizer {opt.label} names parameter '{missing}', which is no tensor of the "
                            f"model; {HINT}", file=label, tensor=missing)
        opt.owner = {i: f"{found}{n}" for i, n in zip(ids, by_name, strict=True)}
        opt.prefix = found
        opt.rule = "param_names in param_groups" if opt.param_names is not None else "name keys"
        return
    if len(opt.params) > 1:  # ids number the groups' params in group order: not the model's order
        raise PlanError(f"the optimizer {opt.label} has {len(opt.params)} param groups and no parameter names: its "
                        "ids follow the groups, not the model, so which state belongs to which tensor is not "
                        f"certain; {HINT}", file=label)
    params = list(model) if prefix is None else [n for n in model if n.startswith(prefix)]
    if len(params) != len(ids):
        raise PlanError(f"the optimizer {opt.label} has {len(ids)} parameters and no names, the model has "
                        f"{len(params)} tensors (buffers or several models?): which state belongs to which tensor "
                        f"is not certain; {HINT}", file=label)
    opt.owner = dict(zip(ids, params, strict=True))
    opt.rule = f"parameter order ({len(ids)} parameters, {len(params)} model tensors)"
    if prefix is None and container is not None and all(n.startswith(container) for n in params):
        # the names written for it are the model's own (`layers.0.weight`, as named_parameters() gives
        # them): without the key of the dict that holds every parameter (`model.` in {"model": ...})
        opt.prefix = container


def model_dict(tree: CheckpointTree | None, names: Sequence[str]) -> str | None:
    """`key.` when every name is a tensor inside the dict the checkpoint holds under `key` at its top
    level (`{"model": {...}, "optimizer": ...}`); None otherwise (tensors at the top level)."""
    from ..formats.pytorch.tree import Node

    heads = {n.split(".", 1)[0] for n in names if "." in n}
    if tree is None or len(heads) != 1 or any("." not in n for n in names) or not tree.root.is_dict:
        return None
    head = heads.pop()
    value = next((v for k, v in tree.root.items() if str(k) == head), None)
    return f"{head}." if isinstance(value, Node) and value.is_dict else None


def _prefixes(model: Sequence[str], given: str | None) -> list[str]:
    if given is not None:
        return [given]
    return ["", *dict.fromkeys(n.split(".", 1)[0] + "." for n in model if "." in n)]


def _model_prefix(names: Sequence[str], model: Sequence[str], known: set[str], given: str | None) -> str | None:
    """The one prefix under which every parameter name is a model tensor."""
    fits = [p for p in _prefixes(model, given) if all(f"{p}{n}" in known for n in names)]
    return fits[0] if len(fits) == 1 else None

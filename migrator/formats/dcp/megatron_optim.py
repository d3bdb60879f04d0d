"""Megatron-core's optimizer state written into a `torch_dist` checkpoint, as the non-distributed optimizer
saves it, from a training checkpoint kept whole (`training_state: keep`).

The structure the plan hands over is the state dict `{<model tensors>, "optimizer": {"state": {<param>:
{"step", "exp_avg", ...}}, "param_groups": [...]}}`, keyed by names (what the torch_dist reader lists, or
torch's `get_optimizer_state_dict` layout). megatron-core's `FP32Optimizer.sharded_state_dict` keeps:

* each per-parameter tensor as `optimizer.state.<key>.<param's sharded key>`, shaped as the parameter
  (stacked on the layer axis as it is), in the DCP files;
* in `common.pt`, `{"optimizer": {"state": {"common_step": <0-d tensor>}, "param_groups": [...]}}`: one
  step for every parameter (`_extract_common_per_param_step` refuses steps that differ), and the groups'
  hyperparameters without their `params` (megatron rebuilds those from the model, and its load matches
  saved groups to its own by `wd_mult`, `lr_mult`, `is_expert_parallel` and `is_decoupled_lr`).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from ...core.errors import PlanError
from ...core.tensor import LazyTensor
from ..pytorch.tree import Node, TensorSlot
from .flatten import plain

GROUP_KEYS = ("wd_mult", "lr_mult", "is_expert_parallel", "is_decoupled_lr")
"""megatron-core's `param_group_identifier_keys`: what its load matches saved param groups by."""
STEP = "common_step"


OptimizerCommon = tuple[LazyTensor, list[dict[str, Any]]]
"""What the optimizer puts in common.pt: its step (one for every parameter) and its groups' hyperparameters."""


def megatron_optimizer(tensors: Sequence[LazyTensor],
                       structure: Node) -> tuple[list[LazyTensor], OptimizerCommon | None]:
    """The tensors to write (the model's, then each moment under megatron's key) and the optimizer's part of
    common.pt (None: the structure holds no optimizer)."""
    by_name = {t.name: t for t in tensors}
    if not structure.is_dict:
        raise PlanError("a Megatron torch_dist target takes a state dict (a dict); this structure is a "
                        f"{structure.kind}")
    model: list[LazyTensor] = []
    optimizer: Node | None = None
    for key, value in structure.items():
        if isinstance(value, TensorSlot):
            model.append(by_name[value.name])
        elif key == "optimizer" and isinstance(value, Node) and value.is_dict:
            optimizer = value
        elif isinstance(value, Node) and value.tensors:
            raise PlanError(f"a Megatron torch_dist target holds the model's tensors at the top level and megatron's "
                            f"optimizer under 'optimizer'; '{key}' holds tensors too (a whole checkpoint of another "
                            "trainer: set source.top_level_key to its model and training_state: drop)")
    if optimizer is None:
        return list(tensors), None
    parts = dict(zip(optimizer.keys, optimizer.values, strict=True))
    state, groups = parts.get("state"), parts.get("param_groups")
    if not isinstance(state, Node) or not state.is_dict or not isinstance(groups, Node) or groups.is_dict:
        raise PlanError("'optimizer' is not an optimizer state dict (state and param_groups)")
    shapes = {t.name: t.shape for t in model}
    moments: list[LazyTensor] = []
    steps: list[LazyTensor] = []
    for param, one in state.items():
        if type(param) is not str or param not in shapes:
            raise PlanError(f"optimizer state for '{param}', which is no tensor of the model: megatron keys state by "
                            "its parameter's name (torch's ids that are numbers say nothing of which)")
        if not isinstance(one, Node) or not one.is_dict:
            raise PlanError(f"optimizer.state.{param} is not a dict of state")
        for key, value in one.items():
            where = f"optimizer.state.{param}.{key}"
            if key == "step":
                if not isinstance(value, TensorSlot) or by_name[value.name].shape != ():
                    raise PlanError(f"{where} is {value!r}, not the 0-d tensor megatron-core saves as its common step",
                                    tensor=where)
                steps.append(by_name[value.name])
                continue
            if not isinstance(value, TensorSlot) or by_name[value.name].shape != shapes[param]:
                raise PlanError(f"{where} is not a tensor shaped as its parameter {list(shapes[param])}: megatron's "
                                "optimizer keeps one per element", tensor=where)
            moments.append(by_name[value.name].renamed(f"optimizer.state.{key}.{param}"))
    if not steps:
        raise PlanError("the optimizer holds no step: megatron-core's load needs its common step")
    first = steps[0]
    for s in steps[1:]:
        if s.dtype != first.dtype or bytes(s.data()) != bytes(first.data()):
            raise PlanError(f"'{s.name}' and '{first.name}' differ: megatron-core keeps one step for every parameter",
                            tensor=s.name)
    saved = []
    for g, group in enumerate(groups.values):
        if not isinstance(group, Node) or not group.is_dict:
            raise PlanError(f"optimizer.param_groups.{g} is not a dict")
        hyper = {str(k): plain(v, f"optimizer.param_groups.{g}.{k}") for k, v in group.items()
                 if k not in ("params", "param_names")}
        missing = [k for k in GROUP_KEYS if k not in hyper]
        if missing:
            raise PlanError(f"optimizer.param_groups.{g} has no {', '.join(missing)}: megatron-core's load matches its "
                            f"param groups by {', '.join(GROUP_KEYS)} (a checkpoint of megatron's optimizer has them)")
        saved.append(hyper)
    return [*model, *moments], (first, saved)


def common_bytes(values: dict[str, Any], optimizer: OptimizerCommon | None) -> bytes:
    """common.pt: `values` (Megatron-LM's `args`, `checkpoint_version`, `iteration`, or `{}` for a model
    alone: every value of its state dict is sharded), then the optimizer's common part when there is one."""
    from .items import StructureItem, ValueItem

    sink = io.BytesIO()
    if optimizer is None:
        ValueItem(values, "common.pt").write_to(sink)
        return sink.getvalue()
    step, groups = optimizer
    root = Node("dict", keys=list(values), values=list(values.values()), tensors=True)
    params = Node("list", values=[_node(g) for g in groups])
    inner = Node("dict", keys=["state", "param_groups"],
                 values=[Node("dict", keys=[STEP], values=[TensorSlot(STEP)], tensors=True), params], tensors=True)
    root.keys.append("optimizer")
    root.values.append(inner)
    StructureItem([step.renamed(STEP)], root, "common.pt").write_to(sink)
    return sink.getvalue()


def _node(value: Any) -> Any:
    if isinstance(value, dict):
        return Node("dict", keys=list(value), values=[_node(v) for v in value.values()])
    if isinstance(value, (list, tuple)):
        return Node("tuple" if isinstance(value, tuple) else "list", values=[_node(v) for v in value])
    return value

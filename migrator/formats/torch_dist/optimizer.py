"""Megatron-core's optimizer state in a `torch_dist` checkpoint, matched to the parameters it belongs to.

Megatron-LM saves `model_sd | {"optimizer": optimizer.sharded_state_dict(model_sd)}`. Two layouts of
megatron-core 0.16 keep one tensor per parameter, under the parameter's own sharded key, so each
moment is matched to its parameter by name (never by position):

* the non-distributed optimizer (`FP32Optimizer`): `optimizer.state.<key>.<param>` (`exp_avg`,
  `exp_avg_sq`), with the layer axis stacked as the parameter's (16-bit training's
  `Float16OptimizerWithFloat16Params` adds `fp32_param` and nests its common part one level deeper:
  listed per parameter, not tested);
* the distributed optimizer's `fully_reshardable` (gathered to canonical per-parameter tensors on
  save): the same names, plus `param` (the fp32 master).

`common.pt` holds what is not sharded: `optimizer.state.common_step` (one step for every parameter,
a 0-d tensor), the `param_groups` (hyperparameters only: megatron-core does not persist which
parameters a group holds) and, for the distributed optimizer, `param_state_sharding_type`.

Other layouts are flat buffers of a bucket's parameters, laid out by the model's code (its parameter
order, alignment padding): `dp_reshardable` (`optimizer.distributed.dp_group_idx_<g>.gbuf_idx_<b>.
dtype_(...).bucket_idx_<k>.<key>`), `fully_sharded_bucket_space`, or `fully_sharded_model_space`
(flattened ranges). Nothing in the checkpoint says where a parameter sits in them: they are listed as
stored, and keeping them as training state is refused naming the layout.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.bytesource import ByteSource
from ...core.limits import Limits
from ...core.tensor import LazyTensor
from ..pytorch.reader import PytorchReader
from ..pytorch.tree import SOURCE_SLOT, CheckpointTree, Node, is_plain
from ..safepickle import values as sp

MOMENT = re.compile(r"^optimizer\.state\.(?P<key>[A-Za-z_]\w*)\.(?P<param>.+)$")
STEP = "common_step"
PER_PARAMETER = ("non-distributed", "fully_reshardable")
"""The layouts whose tensors are one per parameter, under its name."""


@dataclass
class MegatronOptimizer:
    """What the checkpoint holds of megatron's optimizer. `moments`: per stored parameter key, its
    (state key, stored tensor key) pairs; `step`: common.pt's common step; `groups`: each param group's
    hyperparameters as stored; `flat`: stored keys of a layout that cannot be matched to parameters."""

    layout: str
    moments: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    step: LazyTensor | None = None
    groups: list[dict[str, Any]] = field(default_factory=list)
    flat: list[str] = field(default_factory=list)
    refusal: str | None = None  # why `training_state: keep` cannot keep it


class _OptimizerCommon(PytorchReader):
    """common.pt with only its `optimizer` entry's common step listed as a tensor."""

    root: Any = None

    def _flatten(self, root: Any, prefix: str) -> Any:
        self.root = root
        opt = root.get("optimizer") if isinstance(root, dict) else None
        state = opt.get("state") if isinstance(opt, dict) else None
        step = state.get(STEP) if isinstance(state, dict) else None
        return super()._flatten({STEP: step} if type(step) is sp.TensorRef else {}, prefix)


def find(shapes: Mapping[str, Sequence[int]], params: set[str], common: ByteSource | None, limits: Limits,
         reformulated: set[str] | frozenset[str] = frozenset()) -> MegatronOptimizer | None:
    """The optimizer state among the checkpoint's tensors (`shapes`: each stored key's global shape;
    `params`: the keys that are the model's), with common.pt's part; None when the checkpoint holds none.
    A moment is its parameter's only when stored with the parameter's shape: megatron-core <= 0.15's
    `fully_sharded_model_space` saved flattened ranges, which its torch_dist strategy stored reshaped
    (`reformulated`: the keys `.metadata`'s `mcore_data` gives an `nd_reformulated_orig_global_shape`)."""
    moments: dict[str, list[tuple[str, str]]] = {}
    flat: list[str] = []
    odd: str | None = None
    for name, shape in shapes.items():
        m = MOMENT.match(name)
        if m is not None and m.group("param") in params:
            if tuple(shape) == tuple(shapes[m.group("param")]) and name not in reformulated:
                moments.setdefault(m.group("param"), []).append((m.group("key"), name))
                continue
            odd = odd or (f"'{name}' is stored with shape {list(shape)}, not its parameter's "
                          f"{list(shapes[m.group('param')])}" + (" (an N-D reformulation of flattened ranges, "
                                                                   "nd_reformulated_orig_global_shape in .metadata)"
                                                                   if name in reformulated else ""))
        if name.startswith("optimizer."):
            flat.append(name)
    root: Any = None
    step = None
    if common is not None:
        reader = _OptimizerCommon(common, limits=limits)
        root = reader.root
        step = reader.tensors[0] if reader.tensors else None
    opt = root.get("optimizer") if isinstance(root, dict) else None
    if not moments and not flat and not isinstance(opt, dict):
        return None
    opt = opt if isinstance(opt, dict) else {}
    sharding = opt.get("param_state_sharding_type")
    layout = sharding if isinstance(sharding, str) else "non-distributed" if moments or not flat else "flat buffers"
    found = MegatronOptimizer(layout, moments, step, flat=flat)
    groups = opt.get("param_groups")
    if odd is not None:
        found.refusal = (f"megatron-core's optimizer state {odd}: megatron-core <= 0.15's fully_sharded_model_space "
                         "layout (--ckpt-fully-parallel-save with the distributed optimizer), whose elements are not "
                         "matched to parameters here; set training_state: drop")
    elif flat or (sharding is not None and sharding not in PER_PARAMETER):
        found.refusal = (f"megatron-core's optimizer state is in its '{layout}' layout (flat buffers of each bucket's "
                         "parameters, laid out by the model's code): which elements belong to which parameter is not "
                         "in the checkpoint; save with the non-distributed optimizer or the distributed optimizer's "
                         "'fully_reshardable' format (--dist-ckpt-optim-fully-reshardable), or set training_state: "
                         "drop")
    elif not moments:
        found.refusal = "megatron-core's optimizer holds no per-parameter state in this checkpoint (never stepped?)"
    elif not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups) or not groups:
        found.refusal = "common.pt's optimizer has no param_groups (a list of dicts): its hyperparameters are unknown"
    else:
        found.groups = groups
    if step is None and found.refusal is None and moments:
        found.refusal = f"common.pt's optimizer state has no {STEP} tensor: the step count is unknown"
    return found


def _group_value(v: Any) -> Any:
    """A hyperparameter as the tree keeps it: plain, or a list/tuple of plain values (`betas`)."""
    if is_plain(v):
        return v
    if isinstance(v, (list, tuple)) and all(is_plain(x) for x in v):
        return Node("tuple" if isinstance(v, tuple) else "list", values=list(v))
    return None


def assign_groups(opt: MegatronOptimizer, shapes: Mapping[str, Sequence[int]]) -> list[list[str]] | str:
    """Each parameter's group, or why none is certain. megatron-core persists no group's parameters:
    its default rule (`_get_param_groups`: no weight decay, `wd_mult` 0.0, for biases and 1-D
    parameters; experts apart, `is_expert_parallel`) gives each parameter its key, which must match
    exactly one saved group's recorded `wd_mult` and `is_expert_parallel` (megatron-core's own load
    matches saved groups to its own by such recorded keys, `param_group_identifier_keys`); custom
    overrides (a decoupled learning rate, ...) make groups that rule cannot tell apart: refused."""
    keys = []
    for g in opt.groups:
        wd, expert = g.get("wd_mult"), g.get("is_expert_parallel", False)
        if not isinstance(wd, (int, float)) or isinstance(wd, bool) or type(expert) is not bool:
            return "common.pt's param_groups do not record wd_mult and is_expert_parallel"
        keys.append((float(wd), expert))
    out: list[list[str]] = [[] for _ in opt.groups]
    for name, shape in shapes.items():
        want = (0.0 if len(shape) == 1 or name.endswith(".bias") else 1.0, ".mlp.experts." in name)
        fits = [i for i, k in enumerate(keys) if k == want]
        if len(fits) != 1:
            return (f"megatron-core saves no parameter list in its param groups, and {len(fits)} of the "
                    f"{len(keys)} saved groups fit '{name}' by megatron-core's default rule (wd_mult "
                    f"{want[0]}, is_expert_parallel {want[1]})")
        out[fits[0]].append(name)
    return out


def tree(model: Sequence[str], state: Sequence[tuple[str, Sequence[str]]], opt: MegatronOptimizer,
         members: Sequence[Sequence[str]]) -> CheckpointTree:
    """The checkpoint as a nested state dict, the reader's tensors in slot order: the model's tensors
    at the top (`model`), then `optimizer` = {"state": {param: {"step", moments...}}, "param_groups":
    [hyperparameters + "params": names]}, as torch's `get_optimizer_state_dict` keys it (by names).
    `state`: per parameter, its state keys in the reader's order."""
    root = Node("dict", tensors=True)
    for _ in model:
        root.keys.append(None)
        root.values.append(SOURCE_SLOT)
    states = Node("dict", tensors=True)
    for param, keys in state:
        one = Node("dict", tensors=True)
        for _ in keys:
            one.keys.append(None)
            one.values.append(SOURCE_SLOT)
        states.keys.append(param)
        states.values.append(one)
    groups = Node("list")
    dropped: list[str] = []
    for g, (hyper, names) in enumerate(zip(opt.groups, members, strict=True)):
        node = Node("dict")
        for k, v in hyper.items():
            kept = _group_value(v)
            if type(k) is not str or k == "params" or (kept is None and v is not None):
                dropped.append(f"optimizer.param_groups.{g}.{k}")
                continue
            node.keys.append(k)
            node.values.append(kept)
        node.keys.append("params")
        node.values.append(Node("list", values=list(names)))
        groups.values.append(node)
    optimizer = Node("dict", keys=["state", "param_groups"], values=[states, groups], tensors=True)
    root.keys.append("optimizer")
    root.values.append(optimizer)
    return CheckpointTree(root, dropped=dropped, dropped_count=len(dropped))

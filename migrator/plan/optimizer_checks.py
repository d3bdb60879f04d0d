"""Whether an optimizer's state fits the parameters it was matched to (`optimizer_dicts.identify`).

Names in `param_groups` (or ids that are names, or the model's order) say which parameter each id is;
the moments say it too, by their shape. When the two disagree, the names are not followed: a moment
given to a parameter of another shape fails at the next step, one given to a same-shaped neighbour
trains it with the wrong numbers, silently. Every rule (names, name keys, order, and the names a
caller derives for a checkpoint that saved none) goes through `check_state_shapes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import PlanError

PER_ELEMENT = frozenset({
    # the state torch's optimizers keep one value per element of the parameter (torch/optim/*.py:
    # zeros_like / full_like of the parameter or its gradient); ASGD's eta and mu are 0-d, Adafactor's
    # row_var and col_var factored (neither is listed); SparseAdam keeps Adam's names
    "exp_avg", "exp_avg_sq", "max_exp_avg_sq",  # Adam, AdamW, NAdam, RAdam, SparseAdam
    "momentum_buffer",  # SGD, RMSprop (momentum), Muon
    "square_avg", "acc_delta",  # Adadelta (square_avg: RMSprop too)
    "grad_avg",  # RMSprop (centered)
    "sum",  # Adagrad
    "exp_inf",  # Adamax
    "ax",  # ASGD
    "prev", "step_size",  # Rprop
    "variance",  # Adafactor, on parameters of fewer than 2 dimensions
})


def check_state_shapes(opt: Any, shapes: Mapping[str, Sequence[int]], tensor_shapes: Mapping[str, Sequence[int]],
                       hint: str) -> None:
    """Refuse (PlanError naming the param group) an id whose per-element state is not shaped like the
    parameter it was matched to. `opt`: an `optimizer_dicts.Optimizer` with its owners filled; `shapes`:
    each model tensor's shape by its reader name; `tensor_shapes`: each state tensor's, by its reader
    name; `hint`: how to save a checkpoint whose state can be matched."""
    where = f"{opt.path}.param_groups" if opt.path else "param_groups"
    group_of = {i: g for g, ids in enumerate(opt.params) for i in ids}
    for key, ps in opt.states.items():
        owner = opt.owner.get(key)
        if owner is None or owner not in shapes:
            continue  # state no group lists: refused by the follow, naming it
        want = tuple(shapes[owner])
        for k, name in ps.tensors.items():
            got = tuple(tensor_shapes[name])
            if k in PER_ELEMENT and got != want:
                g = group_of.get(key)
                group = f"{where}[{g}]" if g is not None else where
                raise PlanError(f"{group} gives id {key!r} to '{owner[len(opt.prefix):]}' (shape {list(want)}) by "
                                f"{opt.rule}, but its '{k}' has shape {list(got)}: the state belongs to another "
                                f"parameter; {hint}", file=opt.file, tensor=name)

"""In which order a kept optimizer lists its parameters and state, and their new ids.

torch's `state_dict` numbers ids group after group in `params` order and `load_state_dict` pairs them
with the new optimizer's parameters by position; DCP keys them by name, and `dcp_to_torch_save`
writes groups and state in the saved order. `output_order` keeps that order through a recipe (an
output in its source's place), or follows the new model's own order when it is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import MigratorError, PlanError

if TYPE_CHECKING:
    from ..storage.read_context import ReadContext

Key = int | str


def output_order(opt: Any, kept: Sequence[tuple[int, int, list[Key], str]], by_name: bool,
                 order: Sequence[str] | None) -> tuple[dict[int, Key], list[int], list[int]]:
    """The kept outputs' new ids (by entry index), their order in the groups' `params` and in `state`
    (indices into `kept`). Each output takes its first source's place, a split's parts in their order,
    so a run that renames nothing writes the optimizer as it was: ids numbered group after group in
    `params` order, as torch's `state_dict` numbers them (a name-keyed optimizer's ids are the names),
    `state` in the source's order. `order`: the new model's parameter names (relative, as the
    optimizer's are); each group then lists its parameters in that order, and `state` follows, so an
    optimizer built over the new model's `parameters()` loads the ids by position as well."""
    place = {i: j for ids in opt.params for j, i in enumerate(ids)}
    rank = None if order is None else {n: j for j, n in enumerate(order)}
    last = len(rank) if rank is not None else 0
    if rank is not None:
        missing = next((rel for _, _, _, rel in kept if rel not in rank), None)
        if missing is not None:  # half an order would pair the rest by position wrongly
            raise PlanError(f"target.param_order names no '{missing}', a parameter the optimizer {opt.label} keeps: "
                            "it must be a state dict of the new model", tensor=missing)

    def in_group(k: int) -> tuple[int, int, int, int]:
        n, g, ids, rel = kept[k]
        return (g, rank.get(rel, last) if rank is not None else 0, place[ids[0]], n)

    params_order = sorted(range(len(kept)), key=in_group)
    new_of: dict[int, Key] = {}
    for count_, k in enumerate(params_order):
        n, _, _, rel = kept[k]
        new_of[n] = rel if by_name else count_
    if rank is not None:
        return new_of, params_order, params_order
    at = {i: j for j, i in enumerate(opt.states)}
    unstated = len(at)

    def in_state(k: int) -> tuple[int, int]:
        n, _, ids, _ = kept[k]
        return (min((at[i] for i in ids if i in at), default=unstated), n)

    return new_of, params_order, sorted(range(len(kept)), key=in_state)


def new_model_order(path: Path | None, training: Any, fatal: list[str], read: ReadContext) -> list[str] | None:
    """The new model's tensor names in its own order, from `target.param_order` (None when not given);
    a problem goes to `fatal`. Only a format that keeps a model's order will do: a PyTorch state dict
    (its keys as `state_dict()` made them) or a burnpack; SafeTensors sorts its tensors by name."""
    if path is None:
        return None
    if training.burn:
        fatal.append("target.param_order orders torch's parameter ids; Burn's optimizer record is keyed by "
                     "ParamId (leave it out)")
        return None
    from ..files.io import open_file
    from ..formats.registry import is_format

    try:
        with open_file(path, **read.options()) as r:
            if not is_format(r.format, keeps_order=True):
                fatal.append(f"target.param_order: {path} is {r.format}, which does not keep a model's order "
                             "(SafeTensors sorts its tensors by name); give torch.save(new_model.state_dict()) "
                             "or a .bpk")
                return None
            return [t.name for t in r.tensors]
    except MigratorError as e:
        fatal.append(f"target.param_order: {e}")
        return None

"""Resuming from a kept optimizer: its param groups rebuilt over the new model, by name.

torch's `Optimizer.load_state_dict` gives the k-th saved id's state to the k-th parameter of the new
optimizer's groups: by position, whatever `param_names` say. An optimizer built over
`model.named_parameters()` lists the parameters in the order the model's code declares them, which a
recipe's output need not follow (Phi-3 declares `o_proj` before `qkv_proj`, Llama `q_proj` ... before
`o_proj`): the same-shaped neighbours would swap moments silently. `param_groups` lists each saved
group's parameters by their names, in the saved order, so the positions agree. Duck-typed (any object
with `named_parameters()`): migrator imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def param_groups(optimizer_state: Mapping[str, Any], model: Any) -> list[dict[str, Any]]:
    """The param groups of `optimizer_state` (a saved optimizer's state dict: `ckpt["optimizer"]`) over
    `model`'s parameters, each as `(name, parameter)` in the saved order with the group's saved
    hyperparameters: `torch.optim.AdamW(param_groups(ckpt["optimizer"], model))` then
    `load_state_dict(ckpt["optimizer"])` gives each parameter its own state. A group's names are its
    `param_names`, or its `params` when those are names (DCP, `get_optimizer_state_dict`). Raises
    ValueError naming the group when a group has no names, or names a parameter the model lacks."""
    named = dict(model.named_parameters())
    groups = optimizer_state.get("param_groups") if isinstance(optimizer_state, Mapping) else None
    if not isinstance(groups, (list, tuple)):
        raise ValueError("not an optimizer state dict: no param_groups list (pass ckpt['optimizer'])")
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for g, group in enumerate(groups):
        ids = list(group.get("params", ()))
        names = group.get("param_names")
        if names is None and all(isinstance(i, str) for i in ids):
            names = ids  # ids that are names
        if names is None:
            raise ValueError(f"param_groups[{g}] has no param_names: its ids say nothing of which parameter they "
                             "are (migrate writes param_names for every group it keeps)")
        names = list(names)
        if len(names) != len(ids):
            raise ValueError(f"param_groups[{g}] lists {len(ids)} params but {len(names)} param_names")
        for n in names:
            if n not in named:
                close = [m for m in named if m.endswith("." + n) or n.endswith("." + m)][:3]
                hint = f" (the model has {', '.join(close)})" if close else ""
                raise ValueError(f"param_groups[{g}] names parameter '{n}', which the model has not{hint}")
            if n in seen:
                raise ValueError(f"param_groups[{g}] names parameter '{n}', which param_groups[{seen[n]}] names too")
            seen[n] = g
        hyper = {k: v for k, v in group.items() if k not in ("params", "param_names")}
        out.append({**hyper, "params": [(n, named[n]) for n in names]})
    return out


def resume_note(opt: Any) -> str:
    """How to resume from the optimizer written: by name. torch's `load_state_dict` pairs ids with the
    new optimizer's parameters by position, so the optimizer is built over the saved names' parameters
    in the saved order (`migrator.param_groups`); state keyed by names goes through DCP's `set_state_dict`."""
    at = "ckpt" + "".join(f"[{p}]" if p.isdigit() else f"[{p!r}]" for p in opt.path.split(".")) if opt.path else "ckpt"
    build = f"opt = torch.optim.AdamW(migrator.param_groups({at}, model))"
    if getattr(opt, "as_names", False):  # a DCP target: read into the new model's and optimizer's own state dicts
        key = repr(opt.path) if opt.path else "..."
        return (f"to resume {opt.label} from the DCP checkpoint: msd, osd = get_state_dict(model, opt), "
                f"dcp.load({{<the model's key>: msd, {key}: osd}}, checkpoint_id=...), then set_state_dict(model, opt, "
                "model_state_dict=msd, optim_state_dict=osd) (torch.distributed.checkpoint.state_dict): its state is "
                "matched by name")
    if opt.by_name:
        return (f"to resume {opt.label} (keyed by parameter names): {build} (or your optimizer class), then "
                f"torch.distributed.checkpoint.state_dict.set_state_dict(model, opt, model_state_dict=..., "
                f"optim_state_dict={at}) matches its state by name")
    return (f"to resume {opt.label}: {build} (or your optimizer class) builds its groups by param_names, then "
            f"opt.load_state_dict({at}); torch pairs ids with parameters by position, so an optimizer over "
            "model.named_parameters() can give a parameter another's state")

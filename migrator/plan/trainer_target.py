"""A Hugging Face Trainer checkpoint folder as a run's target (`training_state: keep`, a folder target,
a Trainer checkpoint as the source): the model through the recipe into the folder, the optimizer's
state (followed by `training_state.follow`) into `optimizer.pt` with its ids in the Trainer's order.

torch's `Optimizer.load_state_dict` gives the saved state to the parameters by position: the k-th id
of the saved groups is the k-th parameter of the new optimizer's groups, which the Trainer builds in
the model's own order (`files.trainer_order`). So each group's ids are renumbered 0, 1, ... in the
order the source's groups were derived to have (`TrainerReader.order`), and the state keyed alike.
When the output model has the source's parameters (a copy, a cast, a rename there and back), that
order is the source's. A model with other parameters (a Phi-3 split into Llama's q/k/v) has its own
order: derived with transformers from the config.json copied into the folder from `--copy-from`,
and each group must then hold exactly the parameters whose state the recipe put in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.errors import PlanError
from ..formats.base import Reader, Writer
from .entry import PlanEntry
from .training_state import Training


def trainer_writer(training: Training, entries: Sequence[PlanEntry], reader: Reader, fmt: str,
                   **options: Any) -> Writer:
    """The folder's writer: the model's entries into `fmt` shards, the optimizer's into optimizer.pt."""
    from ..files.trainer import TrainerReader
    from ..files.trainer_writer import TrainerFolderWriter
    from ..formats.pytorch_writer import PytorchWriter

    assert isinstance(reader, TrainerReader)
    model = [e.tensor for e in entries if e.optimizer is None]
    state = [e.tensor for e in entries if e.optimizer is not None]
    if len(training.optimizers) != 1 or "optimizer" not in training.swap:
        raise PlanError("a Trainer folder target holds one optimizer, from the source's optimizer.pt")
    node, _ = training.swap["optimizer"]
    if node is None:
        raise PlanError("the optimizer's state was dropped: a Trainer folder target needs it (write another target, "
                        "or keep the state)")
    order = reader.order.groups
    if _names(node) != [sorted(g) for g in order]:  # another model: its order from the config it is given
        order = _new_model_order(node, options.get("copy_from"), options.get("copies", ()))
    renumbered = _in_trainer_order(node, order, reader.named)
    optimizer = PytorchWriter(state, structure=renumbered)
    companions = [(reader.root / name, name) for name in reader.companions()]
    return TrainerFolderWriter(fmt, model, optimizer, companions, **options)


def in_source_order(training: Training, reader: Reader) -> None:
    """A Trainer checkpoint into a .pt, its parameters the source's: the ids in the Trainer's order there
    too (`param_names` kept), so an optimizer built as the Trainer builds it loads it even by position."""
    from ..files.trainer import TrainerReader

    assert isinstance(reader, TrainerReader)
    node, slots = training.swap.get("optimizer", (None, 0))
    if node is not None and _names(node) == [sorted(g) for g in reader.order.groups]:
        training.swap["optimizer"] = (_in_trainer_order(node, reader.order.groups, True), slots)


def _names(node: Any) -> list[list[str]]:
    """Each output param group's parameter names, sorted."""
    groups = node.values[node.keys.index("param_groups")]
    return [sorted(g.values[g.keys.index("param_names")].values) for g in groups.values]


def _new_model_order(node: Any, copy_from: Path | None, copies: Sequence[tuple[str, bool]]) -> list[list[str]]:
    """The Trainer's groups of the output model, whose parameters are not the source's: derived from the
    config.json copied into the output from `copy_from`, and refused unless each group holds exactly the
    parameters whose state the recipe put in it."""
    from ..files.trainer_order import Unavailable, trainer_groups

    have = _names(node)
    first = next((n for names in have for n in names), "")
    if copy_from is None or not any(pattern == "config.json" for pattern, _ in copies):
        raise PlanError("the output model has other parameters than the source's: a Trainer folder target numbers "
                        "optimizer.pt in the new model's order, derived from its config.json; give it with "
                        "--copy-from NEW_MODEL_DIR --copy config.json (target.copy_from, target.copy), or write a .pt",
                        tensor=first)
    config = Path(copy_from) / "config.json"
    try:
        groups = trainer_groups(config)
    except Unavailable as e:
        raise PlanError(f"the output model's order cannot be derived from {config}: {e} (write a .pt target "
                        "instead)") from None
    for g, (want, got) in enumerate(zip(groups, have, strict=False)):
        if sorted(want) != got:
            other = sorted(set(want) ^ set(got))
            raise PlanError(f"param group {g} of the output holds {len(got)} parameters, but the Trainer would put "
                            f"{len(want)} in it for the model {config} describes (first difference: '{other[0]}'): "
                            "the recipe's output is not that model", file=str(config), tensor=other[0])
    if len(groups) != len(have):
        raise PlanError(f"the output has {len(have)} param groups, the Trainer's {len(groups)}", file=str(config))
    return groups


def _in_trainer_order(node: Any, order: Sequence[Sequence[str]], named: bool) -> Any:
    """The rebuilt optimizer with group g's ids numbered in `order[g]`'s order after the groups before it,
    its state keyed alike (ascending, as torch saves it); `param_names` kept only if the source had them."""
    from ..formats.pytorch.tree import Node

    groups = node.values[node.keys.index("param_groups")]
    state = node.values[node.keys.index("state")]
    old_state = dict(zip(state.keys, state.values, strict=True))
    new_id: dict[Any, int] = {}
    new_groups = Node(groups.kind)
    start = 0
    for g, group in enumerate(groups.values):
        ids = group.values[group.keys.index("params")].values
        names = group.values[group.keys.index("param_names")].values
        want = list(order[g]) if g < len(order) else []
        if sorted(names) != sorted(want):
            other = next(iter(sorted(set(names) ^ set(want))), None)
            raise PlanError(f"param group {g} of the output holds other parameters than the source's (first: "
                            f"'{other}'): a Trainer folder target keeps the source's model and its order; write a "
                            ".pt target for a model with other parameters", tensor=other)
        position = {n: k for k, n in enumerate(want)}
        for i, n in zip(ids, names, strict=True):
            new_id[i] = start + position[n]
        new = Node(group.kind, attrs=group.attrs)
        for k, v in zip(group.keys, group.values, strict=True):
            if k == "param_names" and not named:
                continue
            if k == "params":
                v = Node("list", values=list(range(start, start + len(want))))
            elif k == "param_names":
                v = Node("list", values=list(want))
            new.keys.append(k)
            new.values.append(v)
        new_groups.values.append(new)
        start += len(want)
    new_state = Node(state.kind, tensors=state.tensors)
    for i in sorted(old_state, key=lambda i: new_id[i]):
        new_state.keys.append(new_id[i])
        new_state.values.append(old_state[i])
    out = Node(node.kind, attrs=node.attrs, tensors=node.tensors)
    for k, v in zip(node.keys, node.values, strict=True):
        out.keys.append(k)
        out.values.append(new_state if k == "state" else new_groups if k == "param_groups" else v)
    return out


def is_trainer_target(recipe: Any, src_path: Path, tpl_path: Path | None) -> bool:
    """Whether the run writes a Trainer folder: `training_state: keep`, a folder target, no template, and
    a Trainer checkpoint as its one source."""
    from ..files.trainer import is_trainer_checkpoint

    return (recipe.training_state == "keep" and recipe.target.shard is not None and tpl_path is None
            and recipe.sources is None and is_trainer_checkpoint(src_path))

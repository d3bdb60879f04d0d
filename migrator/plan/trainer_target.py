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
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core.errors import PlanError
from ..formats.base import Reader, Writer
from .entry import PlanEntry
from .training_state import Training


def trainer_writer(training: Training, entries: Sequence[PlanEntry], reader: Reader, fmt: str,
                   **options: Any) -> Writer:
    """The folder's writer: the model's entries into `fmt` shards, the optimizer's (renumbered by
    `in_trainer_order`) into optimizer.pt, the source folder's other files copied."""
    from ..files.trainer import TrainerReader
    from ..files.trainer_writer import TrainerFolderWriter
    from ..formats.pytorch_writer import PytorchWriter

    assert isinstance(reader, TrainerReader)
    model = [e.tensor for e in entries if e.optimizer is None]
    state = [e.tensor for e in entries if e.optimizer is not None]
    node = training.swap.get("optimizer", (None, 0))[0]
    if len(training.optimizers) != 1 or node is None:
        raise PlanError("a Trainer folder target holds the source's optimizer.pt, kept (training_state: keep)")
    optimizer = PytorchWriter(state, structure=node)
    companions = [(reader.root / name, name) for name in reader.companions()]
    return TrainerFolderWriter(fmt, model, optimizer, companions, **options)


def in_trainer_order(training: Training, reader: Reader, entries: list[PlanEntry], fatal: list[str],
                     copy_from: Path | None = None, copies: Sequence[tuple[str, bool]] = ()) -> list[PlanEntry]:
    """A Trainer checkpoint's optimizer, followed through the recipe, numbered in the Trainer's order:
    into a Trainer folder always (the source's order, or the new model's from the config.json copied from
    `copy_from`: `fatal` says why not), into a .pt while its parameters are the source's (`param_names`
    kept, so the optimizer `Trainer.create_optimizer` builds loads it even by position). The entries,
    the structure's slots and the fates are renamed alike (`optimizer.state.<id>.<key>`)."""
    from ..files.trainer import TrainerReader

    assert isinstance(reader, TrainerReader)
    node, slots = training.swap.get("optimizer", (None, 0))
    if node is None or len(training.optimizers) != 1:
        return entries
    same = _names(node) == [sorted(g) for g in reader.order.groups]
    order = reader.order.groups
    if training.trainer and not same:  # another model: its order from the config it is given
        try:
            order = _new_model_order(node, copy_from, copies)
        except PlanError as e:
            fatal.append(str(e))
            return entries
    elif not same:
        return entries
    base = f"{training.optimizers[0].path}.state."
    renumbered, names = _in_trainer_order(node, order, reader.named or not training.trainer, base)
    training.swap["optimizer"] = (renumbered, slots)
    for fate in training.fates:  # a dropped value's tensor is the source's name: not renamed
        if fate["fate"] != "dropped":
            fate["tensor"] = names.get(fate["tensor"], fate["tensor"])
    out = [e if e.optimizer is None or e.target not in names else
           replace(e, target=names[e.target], tensor=e.tensor.renamed(names[e.target])) for e in entries]
    return out


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


def _in_trainer_order(node: Any, order: Sequence[Sequence[str]], named: bool, base: str) -> tuple[Any, dict[str, str]]:
    """The rebuilt optimizer with group g's ids numbered in `order[g]`'s order after the groups before it,
    its state keyed alike (ascending, as torch saves it), each tensor slot named `{base}{id}.{key}`;
    `param_names` kept only when `named`. Also the new name of each slot's tensor, by its old name."""
    from ..formats.pytorch.tree import Node, TensorSlot

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
    renamed: dict[str, str] = {}
    for i in sorted(old_state, key=lambda i: new_id[i]):
        one = old_state[i]
        again = Node(one.kind, attrs=one.attrs, tensors=one.tensors)
        for k, v in zip(one.keys, one.values, strict=True):
            if isinstance(v, TensorSlot):
                renamed[v.name] = f"{base}{new_id[i]}.{k}"
                v = TensorSlot(renamed[v.name])
            again.keys.append(k)
            again.values.append(v)
        new_state.keys.append(new_id[i])
        new_state.values.append(again)
    out = Node(node.kind, attrs=node.attrs, tensors=node.tensors)
    for k, v in zip(node.keys, node.values, strict=True):
        out.keys.append(k)
        out.values.append(new_state if k == "state" else new_groups if k == "param_groups" else v)
    return out, renamed


def is_trainer_target(recipe: Any, src_path: Path, tpl_path: Path | None) -> bool:
    """Whether the run writes a Trainer folder: `training_state: keep`, a folder target, no template, and
    a Trainer checkpoint as its one source."""
    from ..files.trainer import is_trainer_checkpoint

    return (recipe.training_state == "keep" and recipe.target.shard is not None and tpl_path is None
            and recipe.sources is None and is_trainer_checkpoint(src_path))

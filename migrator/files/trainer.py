"""A Hugging Face Trainer checkpoint folder (`checkpoint-N/`) read as one training checkpoint.

`Trainer._save_checkpoint` writes the model as a model folder (`model.safetensors`, or shards and
their index; `pytorch_model.bin` without SafeTensors) and beside it `optimizer.pt` (the optimizer's
`state_dict()`), `scheduler.pt`, `trainer_state.json`, `rng_state.pth` (one per rank:
`rng_state_<r>.pth`), `training_args.bin`, and the model's config and tokenizer files.

Opened for a run that keeps the training state (`training_state: keep`), the folder lists the whole
checkpoint, as a DeepSpeed ZeRO folder does: `model.<name>` for each weight, then the optimizer's
tensors (`optimizer.state.<id>.<key>`), with `structure` the nested dict `{"model": ..., "optimizer":
...}` to write. optimizer.pt saves no parameter names; each param group is given its `param_names`
from the order `trainer_order` derives and checks, so the plan matches state to parameters by name.
Otherwise (no `keep`) the folder opens as the model folder it holds, as before.

The other files are pickles or the Trainer's own state: they are never unpickled here (a `training_args.bin`
is a pickle of a TrainingArguments object); a Trainer folder target copies their bytes (`trainer_writer`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..core.errors import FormatError
from ..core.limits import DEFAULT_LIMITS, Limits
from ..formats.base import Reader
from .sharded import WEIGHT_SUFFIXES, ShardedReader, ShardSet

OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "trainer_state.json"
MODEL, OPTIMIZER = "model", "optimizer"
"""The whole checkpoint's top-level keys (as a ZeRO folder's)."""


def is_trainer_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a Trainer checkpoint folder: `trainer_state.json` and `optimizer.pt` beside a
    model's weights (names only; nothing is opened)."""
    p = Path(path)
    if not p.is_dir():
        return False
    try:
        names = set(os.listdir(p))
    except OSError:
        return False
    weights = {n for n in names if n.endswith(WEIGHT_SUFFIXES) and n != OPTIMIZER_FILE}
    return STATE_FILE in names and OPTIMIZER_FILE in names and any(n.startswith(("model", "pytorch_model"))
                                                                   for n in weights)


def companions(folder: Path, model_files: set[str]) -> list[str]:
    """The folder's files a Trainer folder target copies byte for byte: every regular file at its top level
    but the model's weights and optimizer.pt (scheduler.pt, trainer_state.json, rng_state*.pth,
    training_args.bin, scaler.pt, config and tokenizer files)."""
    out = []
    for name in sorted(os.listdir(folder)):
        if name in model_files or name == OPTIMIZER_FILE or name.startswith("."):
            continue
        if (folder / name).is_file() and not (folder / name).is_symlink():
            out.append(name)
    return out


class TrainerReader(Reader):
    """A Trainer checkpoint: its model and its optimizer as one whole training checkpoint."""

    format = "trainer"
    keeps_structure = True

    def __init__(self, path: str | os.PathLike[str], *, limits: Limits = DEFAULT_LIMITS,
                 param_order: str | os.PathLike[str] | None = None) -> None:
        from ..formats.pytorch.tree import SOURCE_SLOT, CheckpointTree, Node
        from .single import open_single
        from .trainer_order import Order, check, parameter_order, per_element

        self.root = Path(path)
        self.folder = self.root
        self.metadata: dict[str, str] = {}
        self.scalars = {}
        self.model = ShardedReader(self.folder, "auto", limits=limits)
        try:
            opt_path = self.folder / OPTIMIZER_FILE
            self.optimizer = open_single(opt_path, "pytorch", limits, {"keep_structure": True})
        except BaseException:
            self.model.close()
            raise
        try:
            label = str(opt_path)
            root, groups, ids = _groups(self.optimizer, label)
            shapes_of: dict[str, dict[str, tuple[int, ...]]] = {}
            numel_of: dict[str, dict[str, int]] = {}
            for t in self.optimizer.tensors:
                parts = t.name.split(".", 2)
                if len(parts) == 3 and parts[0] == "state":
                    shapes_of.setdefault(parts[1], {})[parts[2]] = t.shape
                    numel_of.setdefault(parts[1], {})[parts[2]] = t.numel
            model_shapes = {t.name: t.shape for t in self.model.tensors}
            shapes = [per_element(shapes_of.get(str(i), {}), numel_of.get(str(i), {})) for i in ids]
            sizes = [len(g[1]) for g in groups]
            saved = [g.values[g.keys.index("param_names")] for g, _ in groups if "param_names" in g.keys]
            if len(saved) == len(groups) and param_order is None and all(
                    isinstance(n, Node) and all(type(x) is str for x in n.values) for n in saved):
                self.order = Order([list(n.values) for n in saved], "the param_names optimizer.pt saves")
                check(self.order, model_shapes, sizes, shapes, str(self.folder))
            else:
                self.order = parameter_order(self.folder, model_shapes, sizes, shapes, str(self.folder),
                                             param_order, limits)
        except BaseException:
            self.close()
            raise
        self.named = all("param_names" in g.keys for g, _ in groups)  # saved by torch >= 2.6 from named params
        for (group, _), names in zip(groups, self.order.groups, strict=True):
            if "param_names" in group.keys:
                group.values[group.keys.index("param_names")] = Node("list", values=list(names))
            else:
                group.keys.append("param_names")
                group.values.append(Node("list", values=list(names)))
        model_names = [t.name for t in self.model.tensors]
        weights = Node("dict", keys=[None] * len(model_names), values=[SOURCE_SLOT] * len(model_names),
                       tensors=bool(model_names))
        source_tree = self.optimizer.structure
        tree = CheckpointTree(Node("dict", keys=[MODEL, OPTIMIZER], values=[weights, root],
                                   tensors=bool(model_names) or root.tensors))
        tree.kept = [f"{OPTIMIZER}.{k}" for k in source_tree.kept]
        tree.kept_count = source_tree.kept_count
        tree.dropped = [f"{OPTIMIZER}.{k}" for k in source_tree.dropped]
        tree.dropped_count = source_tree.dropped_count
        self.structure = tree
        self.tensors = ([t.renamed(f"{MODEL}.{t.name}") for t in self.model.tensors]
                        + [t.renamed(f"{OPTIMIZER}.{t.name}") for t in self.optimizer.tensors])
        sources = [*self.model.file_readers(), self.optimizer]
        identities = [*self.model.source.identities, self.optimizer.source.identity]
        mode = self.model.source.mode if self.model.source.mode is not None else 0o666
        if self.optimizer.source.mode is not None:
            mode &= self.optimizer.source.mode
        self.source = ShardSet(str(self.folder), sum(r.source.size for r in sources),
                               [i for i in identities if i is not None], mode)
        self.model_files = {os.path.basename(s.path) for s in self.model.shards or ()}
        if self.model.index_path is not None:
            self.model_files.add(self.model.index_path.name)
        self.notes = [f"Trainer checkpoint {self.folder}: optimizer.pt's parameters matched by "
                      f"{self.order.rule}"]

    def companions(self) -> list[str]:
        """What a Trainer folder target copies from this folder (`companions`)."""
        return companions(self.root, self.model_files)

    def extra(self) -> dict[str, Any]:
        return {"trainer": {"optimizer": OPTIMIZER_FILE, "param_groups": [len(g) for g in self.order.groups],
                            "order": self.order.rule, "companions": self.companions()}}

    def describe(self, name: str) -> str:
        return f"{name!r} (Trainer checkpoint {self.root.name})"

    def close(self) -> None:
        for r in (getattr(self, "model", None), getattr(self, "optimizer", None)):
            if r is not None:
                r.close()


def _groups(reader: Reader, label: str) -> tuple[Any, list[tuple[Any, list[int]]], list[int]]:
    """optimizer.pt's root, each param group (its node, its ids) and every id in the groups' order."""
    from ..formats.pytorch.tree import Node

    tree = reader.structure
    root = tree.root if tree is not None else None
    if not isinstance(root, Node) or not root.is_dict or "param_groups" not in root.keys or "state" not in root.keys:
        raise FormatError("not an optimizer state_dict (a dict of state and param_groups)", file=label)
    groups_node = root.values[root.keys.index("param_groups")]
    if not isinstance(groups_node, Node) or groups_node.is_dict:
        raise FormatError("param_groups is not a list", file=label)
    groups: list[tuple[Any, list[int]]] = []
    ids: list[int] = []
    for g, group in enumerate(groups_node.values):
        if not isinstance(group, Node) or not group.is_dict or "params" not in group.keys:
            raise FormatError(f"param_groups[{g}] is not a param group (a dict with params)", file=label)
        params = group.values[group.keys.index("params")]
        if not isinstance(params, Node) or not all(type(i) is int for i in params.values):
            raise FormatError(f"param_groups[{g}].params is not a list of parameter ids", file=label)
        groups.append((group, list(params.values)))  # type: ignore[arg-type]
        ids += params.values  # type: ignore[arg-type]
    if len(set(ids)) != len(ids):
        raise FormatError("param_groups list a parameter id twice", file=label)
    return root, groups, ids


NOT_READ = ("a Hugging Face Trainer checkpoint: only its model is read; its optimizer.pt (and scheduler, trainer "
            "state) is not (--training-state keep reads the whole training checkpoint)")


class TrainerModelReader(ShardedReader):
    """A Trainer checkpoint folder read as the model folder it holds, saying what it leaves out."""

    notes = (NOT_READ,)

    def extra(self) -> dict[str, Any]:
        return {**super().extra(), "notes": [NOT_READ]}

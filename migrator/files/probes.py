"""The checkpoints a local path may name besides one file, tried in order (`files.io.open_file`): each
probe looks at the path (names and small files only, no reader imported until it answers) and opens
it, or answers None and the next one looks. A path no probe claims is one file (`files.single`).

The order is the rule: a Trainer checkpoint read with its training state first (it is also a model
folder); a ZeRO folder is a folder of PyTorch files, so it is asked next; a DCP folder
before the Hugging Face layout of DCP (both hold rank files); a set of rank files before a sharded
model folder, which any folder of weights also is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.limits import Limits
from ..formats.base import Reader
from ..formats.registry import AUTO, is_format
from ..formats.specs import deepspeed, megatron_legacy, nemo, torch_dist


@dataclass
class Asked:
    """What `open_file` was asked to open: a local path, the format named (`auto`), the reader's limits
    and options (a probe that opens the path takes the ones it reads), and whether a training
    checkpoint is read whole (`training_state="keep"`)."""

    path: str | os.PathLike[str]
    format: str
    limits: Limits
    options: dict[str, Any]
    whole: bool = False
    order: Any = None
    """`param_order`: a file whose tensor names give a Trainer checkpoint's parameter order."""


@dataclass(frozen=True)
class Probe:
    what: str
    """What it finds, in words (docs/folders-and-shards.md)."""
    open: Callable[[Asked], Reader | None]


def _trainer(asked: Asked) -> Reader | None:
    """A Hugging Face Trainer checkpoint-N/ read with its training state (`training_state="keep"` and
    `keep_structure`): its model and `optimizer.pt` (`files.trainer`). Only this probe takes a parameter
    order; the others refuse one."""
    if (asked.format == AUTO and asked.whole and asked.options.get("keep_structure")
            and os.path.isdir(asked.path)):
        from .trainer import is_trainer_checkpoint

        if is_trainer_checkpoint(asked.path):
            from .trainer import TrainerReader

            options = asked.options
            no_tag(asked.path, options)
            options.pop("keep_structure", None)
            if options.pop("top_level_key", None) is not None:  # the plan applies a recipe under `model` itself
                raise TypeError("top_level_key does not apply to a whole Trainer checkpoint")
            if options:
                raise TypeError(f"options {sorted(options)} do not apply to a Trainer checkpoint")
            return TrainerReader(asked.path, limits=asked.limits, param_order=asked.order)
    no_order(asked.path, asked.order)
    return None


def _zero(asked: Asked) -> Reader | None:
    """A DeepSpeed ZeRO checkpoint folder: a step folder, or `latest` / `global_step<N>/` with no weights of
    its own. Only this probe takes a step tag; the others refuse one."""
    if (asked.format == AUTO or asked.format == deepspeed.SPEC.name) and os.path.isdir(asked.path):
        from ..formats.deepspeed.folder import is_zero_checkpoint

        if is_zero_checkpoint(asked.path, asked.options.get("tag")):
            from ..formats.deepspeed import ZeroReader

            options = asked.options
            key, tag = options.pop("top_level_key", None), options.pop("tag", None)
            # the consolidated weights are a flat state_dict (what zero_to_fp32 writes, even into a .pt),
            # unless the run keeps the training state: then the whole checkpoint, with its optimizer
            keep = bool(options.pop("keep_structure", False)) and asked.whole
            if options:
                raise TypeError(f"options {sorted(options)} do not apply to a DeepSpeed ZeRO checkpoint")
            return ZeroReader(asked.path, tag=tag, top_level_key=key, keep_structure=keep, limits=asked.limits)
    no_tag(asked.path, asked.options)
    return None


def _nemo(asked: Asked) -> Reader | None:
    """A NeMo 2 checkpoint: a folder of `weights/` (torch_dist) and `context/` (the model's configuration)."""
    if not (asked.format == AUTO or asked.format == nemo.SPEC.name):
        return None
    from ..formats.nemo import nemo_folder

    folder = nemo_folder(asked.path)
    if folder is None:
        return None
    from ..formats.nemo.reader import NemoReader
    from ..storage.read_context import ReadContext
    from .multi_rank import selected

    asked.options.pop("keep_structure", None)  # per-layer tensors: a flat state dict
    return selected(NemoReader(folder, read=ReadContext(asked.limits)), asked.options)


def _torch_dist(asked: Asked) -> Reader | None:
    """A Megatron-core torch_dist checkpoint: a DCP folder with megatron-core's `metadata.json` or
    `common.pt`."""
    if not (asked.format == AUTO or asked.format == torch_dist.SPEC.name):
        return None
    from ..formats.torch_dist import torch_dist_folder

    folder = torch_dist_folder(asked.path)
    if folder is None:
        return None
    from ..formats.nemo.layout import nemo_weights
    from ..formats.torch_dist.reader import TorchDistReader
    from ..storage.read_context import ReadContext
    from .multi_rank import selected

    # the whole training checkpoint (model and megatron's optimizer state) when the target keeps one
    keep = bool(asked.options.pop("keep_structure", False)) and asked.options.get("top_level_key") in (None, "", [])
    reader = TorchDistReader(folder, read=ReadContext(asked.limits), keep_structure=keep)
    opt = reader.optimizer
    if keep and asked.whole and opt is not None and opt.refusal is not None:  # asked for: said why not, by name
        reader.close()
        from ..core.errors import PlanError

        raise PlanError(f"training_state: keep: {opt.refusal}", file=str(folder))
    nemo = nemo_weights(folder)
    if nemo is not None:  # read as saved (NeMo's prefix, the optimizer's state): say how to read the model
        reader.notes = [*reader.notes, f"this is the weights/ of a NeMo 2 checkpoint, read under the names it saves; "
                        f"name the checkpoint folder ({nemo}) to read its model with context/'s configuration"]
    return selected(reader, asked.options)


def _megatron_legacy(asked: Asked) -> Reader | None:
    """A legacy Megatron-LM checkpoint: its save folder (`latest_checkpointed_iteration.txt`) or one
    iteration's folder of `mp_rank_*/model_optim_rng.pt`, joined into global tensors."""
    if not (asked.format == AUTO or asked.format == megatron_legacy.SPEC.name) or not os.path.isdir(asked.path):
        return None
    from ..formats.megatron_legacy.folder import is_megatron_legacy

    if not is_megatron_legacy(asked.path):
        return None
    from ..formats.megatron_legacy import MegatronLegacyReader

    options = asked.options
    options.pop("keep_structure", None)  # the weights only: written back as a flat state_dict
    key = options.pop("top_level_key", None)
    if options:
        raise TypeError(f"options {sorted(options)} do not apply to a Megatron checkpoint")
    reader = MegatronLegacyReader(asked.path, limits=asked.limits)
    if key is not None:
        try:
            reader.select(key)
        except BaseException:
            reader.close()
            raise
    return reader


def _dcp(asked: Asked) -> Reader | None:
    """A PyTorch Distributed Checkpoint: `.metadata` and its .distcp files."""
    from ..formats.dcp import dcp_folder

    folder = dcp_folder(asked.path)
    if folder is None:
        return None
    from ..storage.read_context import ReadContext
    from .multi_rank import open_dcp

    return open_dcp(folder, asked.options, ReadContext(asked.limits))


def _dcp_safetensors(asked: Asked) -> Reader | None:
    """DCP in the Hugging Face storage layout: SafeTensors chunks per rank."""
    if not os.path.isdir(asked.path):
        return None
    from .rank_files import dcp_safetensors_files

    shards = dcp_safetensors_files(asked.path, asked.limits)
    if shards is None:
        return None
    from .dcp_safetensors import DcpSafetensorsReader
    from .multi_rank import selected

    return selected(DcpSafetensorsReader(shards, limits=asked.limits), asked.options)


def _rank_set(asked: Asked) -> Reader | None:
    """verl's per-rank torch.save files of DTensors (or of ShardedTensors), named as one set."""
    from .rank_files import rank_files

    ranks = rank_files(asked.path, asked.limits)
    if ranks is None:
        return None
    from .multi_rank import selected
    from .ranks import RanksReader
    from .sharded_tensor_ranks import open_rank_set

    joined = open_rank_set([list(enumerate(ranks))], asked.limits)
    return selected(joined if joined is not None else RanksReader(ranks, limits=asked.limits), asked.options)


def _any_ranks(asked: Asked) -> Reader | None:
    """`...rank<K>...` torch.save files: a checkpoint if they hold FSDP1 ShardedTensors or DTensors."""
    if not (asked.format == AUTO or is_format(asked.format, torch_names=True, folder=False)):
        return None
    from .rank_files import any_rank_files

    candidates = any_rank_files(asked.path)
    if candidates is None:
        return None
    from .multi_rank import selected
    from .sharded_tensor_ranks import open_rank_set

    joined = open_rank_set(candidates, asked.limits)
    return None if joined is None else selected(joined, asked.options)


def _sharded(asked: Asked) -> Reader | None:
    """A model folder, an index (`*.index.json`) or a glob of shards, read as one source."""
    from .sharded import ShardedReader, is_sharded_path
    from .trainer import TrainerModelReader, is_trainer_checkpoint

    if not is_sharded_path(asked.path):
        return None
    options = asked.options
    key = options.pop("top_level_key", None)
    options.pop("keep_structure", None)  # shards are state_dicts: written back flat
    if options:
        raise TypeError(f"options {sorted(options)} do not apply to a sharded source")
    # a Trainer checkpoint read without its training state: the model folder, saying what is left out
    cls = TrainerModelReader if is_trainer_checkpoint(asked.path) else ShardedReader
    reader = cls(asked.path, asked.format, limits=asked.limits)
    try:
        if key is not None:
            reader.select(key)
    except BaseException:
        reader.close()
        raise
    return reader


PROBES: list[Probe] = [
    Probe("a Hugging Face Trainer checkpoint folder read with its training state", _trainer),
    Probe("a DeepSpeed ZeRO checkpoint folder", _zero),
    Probe("a NeMo 2 checkpoint folder (weights/ and context/)", _nemo),
    Probe("a Megatron-core torch_dist checkpoint folder", _torch_dist),
    Probe("a legacy Megatron-LM checkpoint folder (iter_N/mp_rank_*/model_optim_rng.pt)", _megatron_legacy),
    Probe("a PyTorch Distributed Checkpoint folder", _dcp),
    Probe("a DCP folder in the Hugging Face storage layout", _dcp_safetensors),
    Probe("a set of per-rank DTensor or ShardedTensor files named as one", _rank_set),
    Probe("`...rank<K>...` files holding FSDP1 ShardedTensors or DTensors", _any_ranks),
    Probe("a model folder, index or glob of shards", _sharded),
]
"""In the order they are asked; a folder format's module may add its own (`PROBES.insert`)."""


def probed(asked: Asked) -> Reader | None:
    """The reader of the first probe that claims `asked.path`, or None: one file."""
    for probe in PROBES:
        reader = probe.open(asked)
        if reader is not None:
            return reader
    return None


def no_tag(src: str | os.PathLike[str], options: dict[str, Any]) -> None:
    """A step tag names a step of a ZeRO checkpoint folder: anything else has none to pick."""
    if options.pop("tag", None) is not None:
        from ..core.errors import FormatError

        raise FormatError("a step tag (--tag) applies only to a DeepSpeed ZeRO checkpoint folder", file=os.fspath(src))


def no_order(src: str | os.PathLike[str], order: Any) -> None:
    """A parameter order names the parameters of a Trainer's optimizer.pt: nothing else has one to take."""
    if order is not None:
        from ..core.errors import FormatError

        raise FormatError("a parameter order (--param-order) applies only to a Hugging Face Trainer checkpoint "
                          "folder read with its training state (--training-state keep)", file=os.fspath(src))

"""`TorchDistWriter`: a megatron-core `torch_dist` checkpoint, the folder `dist_checkpointing.load` reads.

megatron-core 0.16's `dist_checkpointing.save` writes a DCP folder (`.metadata`, `__R_N.distcp`) and
two files of its own: `metadata.json`, the backends (`CheckpointingConfig` as JSON: what
`maybe_load_config` needs to call the folder a distributed checkpoint), and `common.pt`, the state
dict's values that are not sharded (`torch.load`ed first by `load`, which fails without it).

The tensors keep megatron's sharded keys (`decoder.layers.self_attention.linear_qkv.weight`), the
layers stacked on a leading `[num_layers, ...]` axis: the global tensor megatron's `ShardedTensor`s
with `prepend_axis_num=1` are pieces of, so one whole chunk serves any tensor- or pipeline-parallel
split on load. The experts of a mixture-of-experts layer (megatron's SequentialMLP) add a second
axis, as its sharded offsets do: `decoder.layers.mlp.experts.experts.linear_fc1.weight` is
`[num_layers, num_experts, ...]` (`STACKED`). Every linear layer megatron builds (`linear_qkv`,
`linear_proj`, `linear_fc1`, `linear_fc2`, each expert's) adds an `_extra_state` `ShardedObject` per
layer (and expert) to its sharded state dict, stored as bytes under
`<module>._extra_state/shard_<layer>_<num_layers>` (`shard_<layer>.<expert>_<num_layers>.<num_experts>`);
`load` asks for each one, so each is written holding what megatron-core stores for a layer without
FP8 state: `torch.save([None])`.

`common.pt` holds what Megatron-LM's `generate_state_dict` puts beside the model: `args` (a
pickled arguments object, `NamespaceValue`, of the training arguments derived from the source's config.json by
`formats.megatron.from_hf`), `checkpoint_version` 3.0 and `iteration` 0, so Megatron-LM's loader and
migrator's Megatron readers find the model's sizes in the checkpoint. `load` returns them beside the
sharded values, as it does for Megatron-LM's checkpoints. Without a config.json it holds `{}`, what
`save` writes for a bare model's sharded state dict, and a note says so.
With a training checkpoint kept whole (`structure`), megatron's optimizer goes beside them as the
non-distributed optimizer saves it (`megatron_optim.py`).
"""

from __future__ import annotations

import io
import itertools
import json
import re
from collections.abc import Mapping, Sequence

from ...core.dtypes import Kind
from ...core.errors import PlanError
from ...core.scalars import Scalar
from ...core.tensor import LazyTensor
from ..megatron.from_hf import (
    CHECKPOINT_VERSION,
    DTYPE_ARGS,
    Facts,
    SourceConfig,
    derived,
    megatron_args,
    torch_dtype_of,
)
from ..pytorch.namespace import DtypeValue, NamespaceValue
from ..pytorch.tree import Node
from .flatten import Leaf
from .items import ValueItem
from .writer import DcpWriter

CONFIG_FILE = "metadata.json"
COMMON_FILE = "common.pt"
CONFIG = {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
          "common_backend_version": 1}
"""megatron-core's `CheckpointingConfig` for a `torch_dist` checkpoint, as `save_config` dumps it."""
LAYERS = "decoder.layers."
OPTIMIZER_STATE = "optimizer.state."
EMBEDDING, OUTPUT = "embedding.word_embeddings.weight", "output_layer.weight"
STACKED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("decoder.layers.mlp.experts.experts.", ("layer", "expert")),
    (LAYERS, ("layer",)),
)
"""The leading axes megatron's sharded tensors carry under a prefix (the first that matches): the layer
(TransformerBlock's `prepend_axis_num`), then the expert of a SequentialMLP (its sharded offsets add
one, under `mlp.experts.experts.` for every `mlp.experts.local_experts.N.`)."""
_UNSTACKED = re.compile(r"(?:^|\.)(?:local_)?(layer|expert)s\.\d+\.")
"""One layer's or expert's tensor (`decoder.layers.0.`, a Hugging Face `model.layers.0.`,
`mlp.experts.local_experts.0.`): megatron's sharded state dict has none."""
_LINEAR = re.compile(r"^(decoder\.layers\.(?:.+\.)?linear_[a-z0-9_]+)\.weight$")
"""A linear layer's weight: its module carries an `_extra_state`."""


def _bytes(value: object, name: str) -> bytes:
    """`torch.save(value)`'s bytes."""
    sink = io.BytesIO()
    ValueItem(value, name).write_to(sink)
    return sink.getvalue()


class TorchDistWriter(DcpWriter):
    """A `torch_dist` checkpoint folder: the DCP files, then `metadata.json` and `common.pt`."""

    format = "torch_dist"

    def __init__(self, tensors: Sequence[LazyTensor], *, metadata: Mapping[str, str] | None = None,
                 scalars: Mapping[str, Scalar] | None = None, structure: Node | None = None,
                 source_config: SourceConfig | None = None) -> None:
        optimizer = None
        if structure is not None:  # a training checkpoint kept whole: megatron's optimizer beside the model
            from .megatron_optim import megatron_optimizer

            tensors, optimizer = megatron_optimizer(tensors, structure)
        self.stacks = _stack_lengths(tensors)
        self.num_layers = self.stacks.get("layer", 0)
        super().__init__(tensors, metadata=metadata, scalars=scalars)
        # the args describe the model: its dtype is the weights', not the float32 moments'
        model = [t for t in tensors if not t.name.startswith(OPTIMIZER_STATE)]
        common, said = _common(model, self.num_layers, source_config)
        self.notes.append(said)
        from .megatron_optim import common_bytes

        self.generated = [(CONFIG_FILE, json.dumps(CONFIG).encode()), (COMMON_FILE, common_bytes(common, optimizer))]
        extra = sum(1 for e in self.entries if e.dtype is None)
        if extra:
            self.notes.append(f"{extra} empty _extra_state entries written, one per linear layer of each layer (and "
                              "expert), as megatron-core stores them for layers without FP8 state")

    def _extra_values(self) -> list[Leaf]:
        out: list[Leaf] = []
        for t in self.tensors:
            m = _LINEAR.match(t.name)
            if m is not None:
                key = f"{m.group(1)}._extra_state"
                counts = [self.stacks[axis] for axis in _axes(t.name)]
                shape = ".".join(map(str, counts))
                out += [((f"{key}/shard_{'.'.join(map(str, at))}_{shape}",), None, [None])
                        for at in itertools.product(*map(range, counts))]
        return out

    def names(self) -> list[str]:
        return [*super().names(), CONFIG_FILE, COMMON_FILE]

    @property
    def total_size(self) -> int:
        return super().total_size + sum(len(data) for _, data in self.generated)


def _common(tensors: Sequence[LazyTensor], layers: int, config: SourceConfig | None) -> tuple[dict[str, object], str]:
    """common.pt's values for `tensors` (`layers` stacked) and the source's config, and the note saying what
    they are."""
    if config is None:
        return {}, ("common.pt holds no training arguments ({}): no config.json beside the source (or named by "
                    "the recipe's config:) to derive them from (a Megatron source's own arguments are not carried "
                    "over); give Megatron-LM the model's sizes, and migrator's Megatron recipes a config")
    by_name = {t.name: t for t in tensors}
    embedding = by_name.get(EMBEDDING)
    weights = [t.dtype.torch_name or "" for t in tensors if t.dtype.kind is Kind.FLOAT]
    rows = embedding.shape if embedding is not None and len(embedding.shape) == 2 else None
    args = megatron_args(config.data, config.path, Facts(
        vocab_rows=rows[0] if rows else None, output_layer=OUTPUT in by_name if rows else None,
        dtype=torch_dtype_of(weights), layers=layers or None, hidden=rows[1] if rows else None))
    pickled = {k: DtypeValue(v) if k in DTYPE_ARGS else v for k, v in args.items()}
    return ({"args": NamespaceValue(pickled), "checkpoint_version": CHECKPOINT_VERSION, "iteration": 0},
            f"common.pt holds Megatron-LM's training arguments (args; checkpoint_version {CHECKPOINT_VERSION}, "
            f"iteration 0), {derived(args, config.path)}")


def _axes(name: str) -> tuple[str, ...]:
    """The stacked axes a tensor of this name leads with (`STACKED`): none outside `decoder.layers.`."""
    return next((axes for prefix, axes in STACKED if name.startswith(prefix)), ())


def _stack_lengths(tensors: Sequence[LazyTensor]) -> dict[str, int]:
    """The length of each stacked axis (layers, experts) that every tensor stacked on it shares; refuses a
    layer or expert kept apart, or tensors that disagree."""
    found: dict[str, tuple[int, str]] = {}
    for t in tensors:
        kept = _UNSTACKED.search(t.name)
        if kept is not None and not t.name.startswith("decoder."):
            raise PlanError("one layer's tensor, not in megatron's layout: recipes/hf-llama-to-megatron.yaml (or "
                            "hf-qwen2-, hf-qwen3-, hf-mixtral-, hf-qwen3-moe-to-megatron.yaml) convert a Hugging "
                            "Face model and leave what megatron's GPTModel has no place for (a bias it lacks, a "
                            "dense layer among expert layers) as it is", tensor=t.name)
        if kept is not None:
            raise PlanError(f"one {kept.group(1)}'s tensor: megatron stacks the layers on a leading axis "
                            "(decoder.layers.<name>, [num_layers, ...]) and a layer's experts on the next "
                            "(decoder.layers.mlp.experts.experts.<name>); the stack op stacks them", tensor=t.name)
        axes = _axes(t.name)
        if len(t.shape) < len(axes):
            raise PlanError(f"a stacked tensor leads with its {' and '.join(axes)} axis; this one has "
                            f"{len(t.shape)} dimensions", tensor=t.name)
        for axis, n in zip(axes, t.shape, strict=False):
            if axis not in found:
                found[axis] = (n, t.name)
            elif n != found[axis][0]:
                raise PlanError(f"its {axis} axis has {n} {axis}s; {found[axis][1]} has {found[axis][0]}",
                                tensor=t.name)
    return {axis: n for axis, (n, _) in found.items()}

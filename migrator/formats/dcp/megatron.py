"""`TorchDistWriter`: a megatron-core `torch_dist` checkpoint, the folder `dist_checkpointing.load` reads.

megatron-core 0.16's `dist_checkpointing.save` writes a DCP folder (`.metadata`, `__R_N.distcp`) and
two files of its own: `metadata.json`, the backends (`CheckpointingConfig` as JSON: what
`maybe_load_config` needs to call the folder a distributed checkpoint), and `common.pt`, the state
dict's values that are not sharded (`torch.load`ed first by `load`, which fails without it).

The tensors keep megatron's sharded keys (`decoder.layers.self_attention.linear_qkv.weight`), the
layers stacked on a leading `[num_layers, ...]` axis: the global tensor megatron's `ShardedTensor`s
with `prepend_axis_num=1` are pieces of, so one whole chunk serves any tensor- or pipeline-parallel
split on load. Every linear layer megatron builds (`linear_qkv`, `linear_proj`, `linear_fc1`,
`linear_fc2`) adds an `_extra_state` `ShardedObject` per layer to its sharded state dict, stored as
bytes under `<module>._extra_state/shard_<layer>_<num_layers>`; `load` asks for each one, so each is
written holding what megatron-core stores for a layer without FP8 state: `torch.save([None])`.

`common.pt` holds an empty dict: what `save` writes for a model's sharded state dict (every value of
it is sharded), so `load` returns the model's state dict alone, ready for `load_state_dict`. With a
training checkpoint kept whole (`structure`), megatron's optimizer goes beside it as the non-distributed
optimizer saves it (`megatron_optim.py`).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping, Sequence

from ...core.errors import PlanError
from ...core.scalars import Scalar
from ...core.tensor import LazyTensor
from ..pytorch.tree import Node
from .flatten import Leaf
from .items import ValueItem
from .writer import DcpWriter

CONFIG_FILE = "metadata.json"
COMMON_FILE = "common.pt"
CONFIG = {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
          "common_backend_version": 1}
"""megatron-core's `CheckpointingConfig` for a `torch_dist` checkpoint, as `save_config` dumps it."""
COMMON: dict[str, object] = {}
LAYERS = "decoder.layers."
_UNSTACKED = re.compile(r"(?:^|\.)layers\.\d+\.")
"""One layer's tensor (`decoder.layers.0.`, a Hugging Face `model.layers.0.`): megatron has none."""
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
                 scalars: Mapping[str, Scalar] | None = None, structure: Node | None = None) -> None:
        common = _bytes(COMMON, COMMON_FILE)
        if structure is not None:  # a training checkpoint kept whole: megatron's optimizer beside the model
            from .megatron_optim import megatron_optimizer

            tensors, common = megatron_optimizer(tensors, structure)
        self.num_layers = _num_layers(tensors)
        super().__init__(tensors, metadata=metadata, scalars=scalars)
        self.generated = [(CONFIG_FILE, json.dumps(CONFIG).encode()), (COMMON_FILE, common)]
        extra = sum(1 for e in self.entries if e.dtype is None)
        if extra:
            self.notes.append(f"{extra} empty _extra_state entries written, one per linear layer and layer, as "
                              "megatron-core stores them for layers without FP8 state")

    def _extra_values(self) -> list[Leaf]:
        out: list[Leaf] = []
        for t in self.tensors:
            m = _LINEAR.match(t.name)
            if m is not None:
                key = f"{m.group(1)}._extra_state"
                out += [((f"{key}/shard_{i}_{self.num_layers}",), None, [None]) for i in range(self.num_layers)]
        return out

    def names(self) -> list[str]:
        return [*super().names(), CONFIG_FILE, COMMON_FILE]

    @property
    def total_size(self) -> int:
        return super().total_size + sum(len(data) for _, data in self.generated)


def _num_layers(tensors: Sequence[LazyTensor]) -> int:
    """The length of the layer axis every `decoder.layers.` tensor shares; refuses a layer kept apart or
    tensors that disagree."""
    found: tuple[int, str] | None = None
    for t in tensors:
        if _UNSTACKED.search(t.name):
            raise PlanError("one layer's tensor: megatron stacks the layers on a leading axis (decoder.layers.<name>, "
                            "[num_layers, ...]); recipes/hf-llama-to-megatron.yaml converts a Hugging Face Llama, "
                            "the stack op stacks layers", tensor=t.name)
        if not t.name.startswith(LAYERS):
            continue
        if not t.shape:
            raise PlanError("a decoder.layers tensor has the layer axis first; this one is a scalar", tensor=t.name)
        if found is None:
            found = (t.shape[0], t.name)
        elif t.shape[0] != found[0]:
            raise PlanError(f"its layer axis has {t.shape[0]} layers; {found[1]} has {found[0]}", tensor=t.name)
    return found[0] if found is not None else 0

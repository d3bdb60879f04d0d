"""`PytorchReader`: opens any torch.save container, then selects and flattens its pickle."""

from __future__ import annotations

from array import array
from typing import Any

from ...core.bytesource import ByteSource
from ...core.limits import DEFAULT_LIMITS, Limits
from ...core.scalars import Scalar
from ...core.tensor import LazyTensor
from ..base import utf8_ok
from ..safepickle import values as sp
from .core import _Span
from .dtensor import ShardLayout, shard_layout
from .flatten import Flattener
from .legacy import LegacyContainer
from .sharded_tensor import ShardedLayout, sharded_layout
from .tar import TarContainer
from .tree import CheckpointTree, describe_tree
from .zip import ZipContainer, _RawMember


class PytorchReader(Flattener, ZipContainer, TarContainer, LegacyContainer):
    """Reads every torch.save container lazily; see the module docstring for the guarantees."""

    format = "pytorch"
    nested_keys = True  # top_level_key walks the pickled dicts
    keeps_structure = True  # keep_structure: the containers around the tensors, for a PyTorch target

    def __init__(
        self,
        source: ByteSource,
        *,
        top_level_key: str | list[str] | tuple[str, ...] | None = None,
        limits: Limits = DEFAULT_LIMITS,
        keep_structure: bool = False,
        dtensor_shards: bool = False,
    ) -> None:
        self.source = source
        self.tensors: list[LazyTensor] = []
        self.metadata: dict[str, str] = {}
        self.scalars: dict[str, Scalar] = {}
        self._limits = limits
        self._extra: dict[str, Any] = {}
        self._opaque: set[str] = set()
        self._protocol: int | None = None
        self._swap = False
        self._spans: dict[str, _Span] = {}  # storage key -> bytes
        self._first_dtype: dict[str, str | None] = {}  # storage key -> dtype of its first reference
        self._storage_refs = {}
        self._ignored: list[str] = []
        self._groups: dict[str, list[str]] = {}  # storage key -> names, for storages read by 2+ tensors
        self._layouts: dict[tuple[Any, ...], tuple[Any, int, int, bool, tuple[int, ...]]] = {}
        self._zip_data: tuple[array, array] | None = None  # see _ZipDirectory.data
        self._zip_found = bytearray()  # 1: _zip_data holds that storage's data offset, checked
        self._zip = False
        self.dtensors = {}
        self.sharded = {}
        self.order = [] if dtensor_shards else None
        root = self._open()
        selected, prefix = self._select(root, top_level_key)
        pending = self._flatten(selected, prefix)
        # DTensors: one rank's shards, which mean nothing alone (`files/ranks.py` joins the ranks' files)
        self.shard_layouts = {name: shard_layout(ref, self.label, name) for name, ref in self.dtensors.items()}
        self.dtensors = {}
        # ShardedTensors (FSDP1): the same, and FSDP's LOCAL_STATE_DICT flat parameters are refused here
        self.sharded_layouts = {name: sharded_layout(ref, self.label, name) for name, ref in self.sharded.items()}
        self.sharded = {}
        if self.sharded_layouts and not dtensor_shards:
            first = next(iter(self.sharded_layouts))
            raise self._err("the file holds ShardedTensors: one rank's shards of FSDP's SHARDED_STATE_DICT; open "
                            "the folder (or a glob) of every rank's file, named like model_rank0.pt, to read the "
                            "whole tensors", first)
        if self.shard_layouts and not dtensor_shards:
            first = next(iter(self.shard_layouts))
            raise self._err("the file holds DTensors: one rank's shards of a distributed checkpoint; open the "
                            "folder (or a glob) of every rank's file, named like model_world_size_N_rank_K.pt, "
                            "to read the whole tensors", first)
        # the containers around the tensors, for a PyTorch target to write back (only without a selection)
        self.structure: CheckpointTree | None = None
        if keep_structure and self._whole:
            self.structure = describe_tree(root, limits, self.label)
        del root, selected  # the pickle's objects go before the tensors are made: a lower peak
        self._root = None  # kept by _select only for the errors of _flatten
        self.tensors = pending.build(self.source)
        del pending
        self._refuse_lone_surrogates()
        # what only the open needed (100k entries each for a 100k-tensor zip): the tensors keep the rest
        self._spans, self._first_dtype, self._layouts, self._storage_refs = {}, {}, {}, {}
        self._zip_members: dict[str, _RawMember] = {}
        self._zip_data, self._zip_found = None, bytearray()
        self._tar_tensors: dict[str, sp.TensorRef] = {}
        self._extra.update(
            byteorder="big" if self._swap else "little",
            pickle_protocol=self._protocol,
            opaque_objects=sorted(self._opaque),
            ignored=self._ignored[:100],
        )

    def _refuse_lone_surrogates(self) -> None:
        """Names must be Unicode text, as in every other format: a pickle's BINUNICODE may carry a lone
        surrogate (torch.load accepts one), which no output format can store and no terminal can show.
        One encode of all the names finds out; only a failure looks for the culprit."""
        names = [t.name for t in self.tensors] + list(self.scalars)
        try:
            "\n".join(names).encode("utf-8")
        except UnicodeEncodeError:
            bad = next(n for n in names if not utf8_ok(n))
            raise self._err(f"name {bad!a} holds a lone surrogate, which is not Unicode text (a SafeTensors "
                            "or burnpack file cannot hold it either)") from None

    # ------------------------------------------------------------------------------------------
    # public extras

    shard_layouts: dict[str, ShardLayout]
    """Per tensor that is a DTensor's local shard: what its spec says (only with `dtensor_shards`)."""

    sharded_layouts: dict[str, ShardedLayout]
    """Per ShardedTensor: what its metadata says; its local shards are the tensors `local_name` names
    (only with `dtensor_shards`, which also keeps the walk's `order`)."""

    def extra(self) -> dict[str, Any]:
        return dict(self._extra)

    def shared_storages(self) -> list[list[str]]:
        """Groups of selected tensor names that read one storage (tied weights, views)."""
        return [names for names in self._groups.values() if len(names) > 1]

    # ------------------------------------------------------------------------------------------
    # containers

    def _open(self) -> Any:
        src = self.source
        head = src.read(0, min(src.size, 512), "header")
        if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
            self._extra["container"] = "zip"
            self._zip = True
            return self._open_zip()
        if len(head) >= 262 and head[257:262] == b"ustar":
            self._extra["container"] = "tar"
            return self._open_tar()
        return self._open_pickle_stream()

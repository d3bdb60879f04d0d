"""The protocol every format implements: a lazy reader and a planned, streaming writer."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from enum import Enum
from operator import attrgetter
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, ClassVar, Protocol

from ..core.bytesource import ByteSource
from ..core.dtypes import DType
from ..core.errors import TensorNotFoundError
from ..core.scalars import Scalar
from ..core.tensor import LazyTensor
from ..naming.similarity import did_you_mean


class ShardFile(Protocol):
    """One file of a sharded source."""

    @property
    def path(self) -> Path: ...


class Reader(Mapping[str, LazyTensor], ABC):
    """A parsed file header: every tensor listed (data order), no tensor bytes read yet.

    A read-only mapping of tensor name -> `LazyTensor`, in data order: `r["w"].numpy()`,
    `r.keys()`, `r.items()`, `dict(r)`, `len(r)`, `"w" in r`; a missing name is a KeyError
    (`TensorNotFoundError`) with a "did you mean". `r.tensors` is the list of tensors. Readers
    compare and hash by identity, not by content.
    """

    __eq__ = object.__eq__  # Mapping's would compare contents (and make readers unhashable)
    __hash__ = object.__hash__

    format: ClassVar[str]
    nested_keys: ClassVar[bool] = False  # True: the constructor takes `top_level_key` itself
    source: ByteSource
    tensors: list[LazyTensor]
    metadata: dict[str, str]
    scalars: dict[str, Scalar]
    # What a source kind adds to a plan; nothing unless a reader sets it (declared here so that a plan
    # reads them as attributes instead of probing each reader):
    notes: Sequence[str] = ()
    """What the source did on its own (a LoRA fold, a merge), for the plan's notes."""
    config_update: Mapping[str, Any] | None = None
    """Entries a merge sets in the config.json copied into a folder target (num_hidden_layers, dtype)."""
    consumed: Sequence[tuple[str, str]] = ()
    """(stored tensor, the tensor it went into) per tensor the source consumed making another (a
    dequantized weight's scales): the report lists them as consumed, not as unused or dropped."""
    config_drop: Sequence[str] = ()
    """Keys dropped from the config.json copied into a folder target (a dequantized source's
    `quantization_config`)."""
    generated: Sequence[tuple[str, bytes]] = ()
    """Companion files the source makes, (name, bytes), written in place of copies of those names."""
    structure: Any = None
    """A PyTorch checkpoint's containers around its tensors (`formats.pytorch.tree.CheckpointTree`), when
    opened with `keep_structure`: a PyTorch target writes them back."""
    keeps_structure: ClassVar[bool] = False
    """Whether the format has containers to keep (`keep_structure`): a PyTorch checkpoint's."""
    # What a folder of files adds (`files.sharded`, `files.remote_sharded`, and the readers over one):
    folder: Path | None = None
    """The folder the source's files are in (a model folder, an index's, a glob's): where a target's
    `copy:` looks for companion files."""
    index_path: Path | None = None
    """A sharded source's index file, when it has one."""
    shards: Sequence[ShardFile] | None = None
    """A sharded source's files, in order; None for a single file."""
    locations: Sequence[tuple[int, int | None]] | None = None
    """Per tensor of a sharded source: its shard (an index into `shards`) and its offset in that file
    (None when the shard's own reader reads it)."""

    @property
    def label(self) -> str:
        return self.source.label

    @property
    def path(self) -> str | None:
        """The file read, or None for an in-memory buffer."""
        return getattr(self.source, "path", None) and str(self.source.path)  # type: ignore[attr-defined]

    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._index()

    def __getitem__(self, name: str) -> LazyTensor:
        try:
            return self._index()[name]
        except (KeyError, TypeError):
            hint = did_you_mean(name, self.names()) if isinstance(name, str) else None
            raise TensorNotFoundError("no such tensor" + (f"; did you mean '{hint}'?" if hint else ""),
                                      file=self.label, tensor=name if isinstance(name, str) else repr(name)) from None

    def get(self, name: str, default: Any = None) -> Any:  # a miss is no error: no suggestion to compute
        return self._index().get(name, default)

    def _index(self) -> dict[str, LazyTensor]:
        idx = self.__dict__.get("_by_name")
        if idx is None:
            idx = {t.name: t for t in self.tensors}
            self.__dict__["_by_name"] = idx
        return idx

    def select(self, top_level_key: str | Sequence[str]) -> None:
        """Keep only the tensors under `top_level_key` (flat formats: a name prefix), renamed without it;
        an optimizer's state left out beside it is said (the notes)."""
        from ..naming.optimizer_names import optimizer_owners

        dotted = top_level_key if isinstance(top_level_key, str) else ".".join(top_level_key)
        owners = optimizer_owners(t.name for t in self.tensors if not t.name.startswith(dotted + "."))
        self.tensors = select_prefix(self.tensors, top_level_key, self.label)
        if owners:
            self.notes = [*self.notes, left_out_note(dotted, list(owners))]
        self.__dict__.pop("_by_name", None)

    def extra(self) -> dict[str, Any]:
        """Format-specific facts for `inspect` (e.g. a burnpack's data-section start)."""
        return {}

    def ggml_type(self, tensor: LazyTensor) -> str | None:
        """The GGUF type `tensor` is stored as (a GGUF file or folder); None for every other format."""
        return None

    def hf_config(self) -> dict[str, Any] | None:
        """The Hugging Face config.json this source's own configuration makes (`target.hf_config`), or
        None when it has none to make one from (a GGUF's is made by the plan from its key/values)."""
        return None

    def describe(self, name: str) -> str:
        """How an error names one of this reader's tensors (several sources say which one it is from)."""
        return repr(name)

    def file_readers(self) -> list[Reader]:
        """The readers of the files this one reads: itself, or each source's of several."""
        return [self]

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def left_out_note(key: str, optimizers: Sequence[str]) -> str:
    """What a top_level_key selecting a model says of the optimizer state beside it, left out."""
    where = ", ".join(f"'{o}'" if o else "the top level" for o in optimizers)
    return (f"top_level_key '{key}': the optimizer state beside it ({where}) is left out; keeping the training "
            "state carries it over (the whole checkpoint into a .pt or a DCP folder, or Burn's optimizer record)")


def select_prefix(tensors: Sequence[LazyTensor], key: str | Sequence[str], label: str) -> list[LazyTensor]:
    """`top_level_key` for formats whose names are flat: keep `key.*`, named without the prefix."""
    dotted = key if isinstance(key, str) else ".".join(key)
    prefix = dotted + "."
    kept = [t.renamed(t.name[len(prefix):]) for t in tensors if t.name.startswith(prefix)]
    if not kept:
        roots = sorted({t.name.split(".", 1)[0] for t in tensors})
        depth = dotted.count(".") + 1  # a typo is looked for among the prefixes as deep as the key
        prefixes = sorted({".".join(t.name.split(".")[:depth]) for t in tensors if t.name.count(".") >= depth})
        hint = did_you_mean(dotted, prefixes)
        raise TensorNotFoundError(f"top_level_key '{dotted}' selects no tensor; top-level names: "
                                  f"{', '.join(roots[:20])}; no tensor is named '{prefix}*'"
                                  + (f"; did you mean '{hint}'?" if hint else ""), file=label, tensor=dotted)
    return kept


class WriterKind(Enum):
    """What a writer produces, which decides how it is published and whether workers can share it."""

    FILE = "file"
    """One file, streamed in order by one writer (a PyTorch zip: its layout is known only as it is written)."""
    LAID_OUT = "laid_out"
    """One file whose header and tensor offsets are planned up front (`Writer.layout`): workers may
    write its tensors' byte ranges side by side."""
    FOLDER = "folder"
    """A folder of shard files, an index and companion files (`files.sharded_writer.ShardedWriter`)."""


class Writer(ABC):
    """Plans a whole output from declared lengths, then streams it tensor by tensor.

    The constructor does every check (dtypes the format cannot hold, duplicate names, lengths),
    so a bad input fails before a file is created.
    """

    format: ClassVar[str]
    default_extension: ClassVar[str]
    kind: ClassVar[WriterKind] = WriterKind.FILE
    companion_sources: Sequence[str | os.PathLike[str]] = ()
    """Files copied into the output beside the tensors (a folder's companions): read by the run."""

    def __init__(
        self,
        tensors: Sequence[LazyTensor],
        *,
        metadata: Mapping[str, str] | None = None,
        scalars: Mapping[str, Scalar] | None = None,
    ) -> None:
        self.tensors = list(tensors)
        self.metadata = dict(metadata or {})
        self.scalars = dict(scalars or {})
        self.notes: list[str] = []  # what the plan should say of the output (a GGUF tensor left F16, ...)

    @property
    @abstractmethod
    def total_size(self) -> int:
        """Exact size of the output in bytes."""

    @abstractmethod
    def write_to(self, sink: BinaryIO) -> None:
        """Stream the output into `sink`, producing each tensor's bytes once, in write order."""

    @staticmethod
    def resolve_path(path: str | os.PathLike[str]) -> str:
        """The path actually written (burnpack appends `.bpk` to extension-less paths)."""
        return os.fspath(path)

    def layout(self) -> tuple[bytes, list[LazyTensor], list[int]]:
        """A LAID_OUT writer's plan: the bytes before the first tensor, the tensors in file order and
        each one's offset."""
        raise NotImplementedError(f"a {self.kind.value} writer has no layout planned up front")


# C-level field getters, for passes over 100k tensors with map()
get_name, get_dtype, get_shape, get_nbytes = (attrgetter(f) for f in ("name", "dtype", "shape", "nbytes"))


def shapes_of(tensors: Iterable[LazyTensor]) -> list[tuple[int, ...]]:
    """Each tensor's shape as a (hashable) tuple, for tables keyed by shape."""
    shapes = list(map(get_shape, tensors))
    return shapes if set(map(type, shapes)) <= {tuple} else list(map(tuple, shapes))


def distinct_str_names(tensors: Sequence[LazyTensor]) -> list[str] | None:
    """The tensors' names when every one is a str and no two are equal, else None."""
    names = list(map(get_name, tensors))
    if not set(map(type, names)) <= {str} or len(set(names)) != len(names):
        return None
    return names


def lengths_match(tensors: Sequence[LazyTensor], dtypes: Sequence[DType],
                  nbytes: Callable[[DType, tuple[int, ...]], int | None] = DType.nbytes) -> bool:
    """Whether each tensor declares `nbytes(dtype, shape)` bytes (`dtypes` one per tensor), computed
    once per distinct dtype and shape, not per tensor. Dtypes are keyed on identity: a C-level id()
    rather than a Python-level DType.__hash__ per tensor."""
    by_id = dict(zip(map(id, dtypes), dtypes, strict=True))
    keys = list(zip(map(id, dtypes), shapes_of(tensors), strict=True))
    need = {key: nbytes(by_id[key[0]], key[1]) for key in set(keys)}
    return list(map(need.__getitem__, keys)) == list(map(get_nbytes, tensors))


def utf8_ok(s: str) -> bool:
    """Whether `s` encodes as UTF-8 (a lone surrogate, e.g. from a pickle's BINUNICODE, does not)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_u64_sizes(tensors: Sequence[LazyTensor], why: str) -> None:
    """Refuse an empty tensor whose dimensions or running element count overflow 64 bits (the
    element count is multiplied out left to right, so [2**40, 2**40, 0] overflows before the 0), as
    the format's reference loader would (`why` says which). A tensor with bytes has sizes bounded
    by its byte count, so only empty tensors are looked at."""
    if 0 not in map(attrgetter("nbytes"), tensors):  # one C-level pass for the usual case
        return
    from ..core.errors import PlanError

    u64 = (1 << 64) - 1
    for t in tensors:
        if t.nbytes:
            continue
        numel = 1
        for d in t.shape:
            numel *= d
            if d > u64 or numel > u64:
                raise PlanError(f"shape {list(t.shape)} overflows 64-bit sizes (element count); {why}",
                                file=t.origin, tensor=t.name)

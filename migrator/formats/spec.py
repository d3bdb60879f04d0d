"""What a format declares about itself, once: `FormatSpec`.

Every list of formats (the command line's choices and help, the recipe schema's literals, the
detection message, docs/formats.md's table) and every question a later stage asks of a format
("does it keep a checkpoint's structure?", "are its names a torch module's?") is read from these
declarations (`formats.registry`), so adding a format is one module declaring one `FormatSpec` and
one registration, not an edit of each list.

Standard library only, and nothing of a codec is imported here: the command line builds its help
from the specs without loading numpy; a spec names its reader and writer as `"module:Class"` strings,
imported when first used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .base import Reader, Writer

MetadataKind = Literal["text", "typed", "none"]
"""`text`: string key/values (burnpack, SafeTensors); `typed`: typed key/values (GGUF); `none`."""


@dataclass(frozen=True)
class Sniff:
    """A test of a file's first bytes (`head`: up to 512 of them; `size`: the whole file's).

    Detection runs every format's sniffs by `rank` (then registry order): 0 for a magic number that
    cannot be mistaken, higher for looser tests that must yield to it (SafeTensors' JSON header is 1,
    a bare pickle 2)."""

    test: Callable[[bytes, int], bool]
    rank: int = 0


@dataclass(frozen=True)
class FormatSpec:
    """One format, declared once (see the module docstring)."""

    name: str
    """The name used everywhere: `--from`/`--to`, a recipe's `format:`, `Reader.format`."""
    title: str
    """How text names it (`SafeTensors`)."""
    summary: str = ""
    """docs/formats.md's description of its files (`PyTorch (torch.save)`)."""
    extensions: tuple[str, ...] = ()
    """Lower-case extensions with their dot; the first is the one docs and hints give first."""
    recognized_by: str = ""
    """What detection looks at (`magic NRUB`), for the detection error and the docs."""
    sniffs: tuple[Sniff, ...] = ()
    reader: str | None = None
    """`"module:Class"` of its `Reader` over one file; None for a folder format (opened by a probe)."""
    writer: str | None = None
    """`"module:Class"` of its `Writer`; None: read only."""
    folder: bool = False
    """Its checkpoints are folders (DCP, ZeRO): found by a folder probe (`files.probes`), never named as
    the format of one file."""
    metadata: MetadataKind = "none"
    metadata_format: str | None = None
    """The `format` entry its writer's default metadata sets (Burn's stores set one); None: no
    default metadata (`plan.metadata`)."""
    format_key_required: bool = False
    """Non-empty metadata must name the `format` (`metadata_format`): transformers 4.x refuses a SafeTensors
    file whose metadata lacks it."""
    torch_names: bool = False
    """Its names are a torch module's state-dict keys (Burn's PyTorch defaults apply: contiguous indices,
    enum variants skipped)."""
    torch_layout: bool = False
    """Its linear weights are stored as torch stores them (out x in): a module-type inference may assume so."""
    keeps_structure: bool = False
    """It holds a checkpoint's containers around its tensors (dicts, lists, an optimizer's state), read
    with `keep_structure` and written back."""
    keeps_order: bool = False
    """Its tensors are in the order the model listed them (torch.save's state_dict order, Burn's): a new
    model's parameter order can be read from one of its files (`target.param_order`). SafeTensors sorts
    its tensors by name."""
    param_ids_by_name: bool = True
    """An optimizer state it holds names its parameters as the file does (a .pt's numbers, DCP's names);
    False: the reader names them itself to match the state (a ZeRO folder's files number them by
    partition), so they are written back as torch's numbers."""
    optimizer_by_name: bool = False
    """An optimizer it holds is keyed by its parameters' names, as torch's `get_state_dict` lays it out (DCP):
    a training state whose ids are numbers is written by name, so `set_state_dict` matches it."""
    trainer_folder: bool = False
    """A Hugging Face Trainer checkpoint folder: its optimizer.pt numbers the parameters in the order
    transformers' Trainer derives (`files/trainer_order.py`), kept when written back as one."""
    scalars: bool = False
    """It stores typed scalars beside the tensors (Burn's)."""
    source_config: bool = False
    """Its writer is given the source's `config.json` (`source_config=`, a `SourceConfig`; None when there
    is none): a Megatron target derives the training arguments of its `common.pt` from it."""
    for_burn: bool = False
    """Burn's own format: a path without extension is this format (Burn appends the extension), a PyTorch
    source is renumbered for it by default (`contiguous_indices`), and a training state is Burn's
    (ParamIds, the optimizer record beside it)."""
    llama_cpp: bool = False
    """llama.cpp's file: quantized types, a tokenizer and rope tensors (a target's `quantize`, `tokenizer`),
    typed key/values; a Llama-family Hugging Face folder converts to it with llama.cpp's names."""
    quantized_layouts: bool = False
    """Its model folders can hold the quantized layouts a `config.json` declares (FP8 blocks,
    compressed-tensors, MXFP4, MLX: `formats/quantized/`): on an object store, only such a folder's
    config.json is looked up."""
    shard_names: tuple[str, str] | None = None
    """A folder of its shards: (file name pattern with `{suffix}`, index file name, "" when the files
    carry their own order); None: it is never written as shards."""
    after_open: Callable[[Reader, str | None], None] | None = field(default=None, compare=False)
    """A check of a reader opened on one file (`reader`, the path or None): a GGUF that is one part of a
    split model is refused read alone."""

    @property
    def readable(self) -> bool:
        return self.reader is not None or self.folder

    @property
    def writable(self) -> bool:
        return self.writer is not None

    @property
    def extension(self) -> str:
        """The extension a writer's output takes by default (`.bpk`)."""
        return self.extensions[0] if self.extensions else ""

    def reader_class(self) -> type[Reader]:
        if self.reader is None:
            from ..core.errors import UnknownFormatError

            raise UnknownFormatError(f"{self.name} is read from its folder, not named as one file's format")
        return _load(self.reader)

    def writer_class(self) -> type[Writer]:
        if self.writer is None:
            from ..core.errors import UnknownFormatError

            raise UnknownFormatError(f"{self.name} is read only: it has no writer")
        return _load(self.writer)


def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)

"""`migrate convert`'s options, declared once.

Each option of a conversion is a field of `ConvertOptions`, the frozen value the command line
builds and `build_recipe` turns into the one-off recipe; the field's metadata is the option's row
(`Option`): its flag, its `--help` group and text, metavar and choices, where its value goes in the
recipe (which also names the option in an error about that value), whether a plain copy
understands it, and whether `diff` takes it for A. The command line (`cli/convert.py`,
`cli/diff.py`) generates its parsers from these rows; nothing else lists them.

Light on purpose (no pydantic, no numpy, no parser): `migrate --help` builds every parser. Lists that
need heavier modules (castable dtypes, GGUF types) are computed only when the help is shown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import adapter_names

TRAINING_STATES = ("keep", "drop")
"""What a run does with a training checkpoint's optimizer state (the recipe's `training_state`)."""


def source_formats() -> tuple[str, ...]:
    """The formats a file or folder is read in, as the command line takes them ("auto": detect): the
    formats registry's."""
    from ..formats.registry import choices

    return choices(readable=True)


def target_formats() -> tuple[str, ...]:
    """The formats a conversion writes ("auto": from DST's extension): the formats registry's."""
    from ..formats.registry import choices

    return choices(writable=True)


def castable_dtypes() -> tuple[str, ...]:
    """The float dtypes a cast can target (what `--dtype` and `float_cast:DTYPE` take)."""
    from ..core.casts import CASTABLE
    from ..core.dtypes import FLOAT_DTYPES

    return tuple(d.display for d in FLOAT_DTYPES if d.name in CASTABLE)


def gguf_types() -> tuple[str, ...]:
    """What `--quantize` takes for a GGUF target: a ggml type the GGUF writer writes, or one of llama.cpp's mixes."""
    from ..formats.gguf.mixes import BASE_TYPES
    from ..formats.gguf.writer import WRITABLE_TYPES

    return (*WRITABLE_TYPES, *(m for m in BASE_TYPES if m not in WRITABLE_TYPES))


def quantize_schemes() -> tuple[str, ...]:
    """What `--quantize` takes for a SafeTensors folder target: compressed-tensors' schemes (one table)."""
    from ..formats.compressed_tensors_schemes import scheme_names

    return scheme_names()


def quantize_types() -> tuple[str, ...]:
    """Every name `--quantize` takes: the compressed-tensors schemes, then the GGUF types and mixes."""
    return (*quantize_schemes(), *gguf_types())


GROUPS: dict[str, tuple[str, str]] = {
    "source": ("reading SRC", ""),
    "names": ("tensor names", "which tensors are written, under which names (a recipe's remap:, filter:)"),
    "tensors": ("tensor values and modules", "a recipe's adapters:, modules:, dtype: and quantize:"),
    "output": ("writing DST", ""),
    "folder": ("a folder DST", "a Hugging Face model folder (see DST); a recipe's target.shard and target.copy"),
    "gguf": ("a GGUF DST", ""),
    "training": ("training state", "a training checkpoint's optimizer state"),
    "recipe": ("the recipe", "the recipe of this conversion, to check in and run again"),
}
"""The groups of `convert --help`, in order: key -> (title, description)."""

KINDS = ("value", "number", "repeat", "pairs", "switch", "off", "toggle")
"""How an option takes its value: one value, a float, repeated values (in order), repeated
KEY=VALUE pairs, a switch that sets True, one (`--no-X`) that sets False, `--X/--no-X`."""


@dataclass(frozen=True)
class Option:
    """One option's row. `help` may hold `%(listed)s`: `listed()`, or the choices (' | '), computed only
    when the help is shown; `recipe` is the dotted place its value takes in the recipe, and `place` says
    that value goes there as it is (else `build_recipe` shapes it)."""

    flag: str
    group: str
    help: str
    kind: str = "value"
    metavar: str | None = None
    choices: Callable[[], Sequence[str]] | None = None
    listed: Callable[[], Sequence[str]] | None = None
    recipe: str | None = None
    place: bool = False
    plain: bool = False
    diff: bool = False
    name: str = ""  # the field of ConvertOptions (filled in by `table`)


def _option(default: Any, flag: str, group: str, help: str, **row: Any) -> Any:
    factory = row.pop("factory", None)
    metadata = {"option": Option(flag, group, help, **row)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ConvertOptions:
    """A conversion's options as a value (what `migrate convert`'s command line says, or
    `migrator.run.convert.convert`'s keywords). The defaults are a plain copy."""

    # reading SRC
    source_format: str = _option(
        "auto", "--from", "source", "SRC's format: %(listed)s (default: auto, detected from its bytes)",
        metavar="FORMAT", choices=source_formats, recipe="source.format", place=True, plain=True, diff=True)
    top_level_key: str | None = _option(
        None, "--top-level-key", "source", "the nested dict (PyTorch) or name prefix holding the tensors; a "
        "DeepSpeed ZeRO folder: 'module' for the module's own weights instead of the fp32 masters",
        metavar="KEY", recipe="source.top_level_key", place=True, diff=True)
    tag: str | None = _option(
        None, "--tag", "source", "a DeepSpeed ZeRO checkpoint folder: the step to read (e.g. global_step10; "
        "default: the one its 'latest' file names)", metavar="STEP", recipe="source.tag", place=True)
    lora: str | None = _option(  # or a PathLike
        None, "--lora", "source", "fold this PEFT LoRA adapter folder into SRC (PEFT's merge_and_unload, streamed); "
        "with DST/ the base's config.json, generation and tokenizer files are carried over",
        metavar="ADAPTER", recipe="source.lora")
    lora_scale: float | None = _option(
        None, "--lora-scale", "source", "with --lora: multiply the adapter's scaling (lora_alpha / r) by S "
        "(default 1)", kind="number", metavar="S", recipe="source.lora")
    # tensor names
    remaps: Sequence[str] = _option(
        (), "--remap", "names", "rename (repeatable, ordered)", kind="repeat", metavar="REGEX=REPL",
        recipe="remap", diff=True)
    includes: Sequence[str] = _option(
        (), "--include", "names", "keep only matching names (repeatable)", kind="repeat", metavar="REGEX",
        recipe="filter.include", diff=True)
    excludes: Sequence[str] = _option(
        (), "--exclude", "names", "drop matching names (repeatable)", kind="repeat", metavar="REGEX",
        recipe="filter.exclude", diff=True)
    contiguous_indices: bool | None = _option(
        None, "--contiguous-indices", "names", "renumber index segments 0,1,2,... (default: on for a PyTorch "
        "source written for Burn, i.e. a .bpk DST or --adapter pytorch_to_burn; the no- form keeps the names)",
        kind="toggle", recipe="source.contiguous_indices", place=True, diff=True)
    # tensor values and modules
    adapters: Sequence[str] = _option(
        (), "--adapter", "tensors", " | ".join(adapter_names.CLI_FORMS) + " (repeatable, chained in order)",
        kind="repeat", metavar="NAME", recipe="adapters", diff=True)
    modules: Sequence[str] = _option(
        (), "--modules", "tensors", "declare the module type of matching module paths, as a recipe's modules: "
        "(repeatable; e.g. Linear='^fc\\d+$')", kind="repeat", metavar="TYPE=REGEX", recipe="modules", diff=True)
    dtype: str | None = _option(
        None, "--dtype", "tensors", "cast every float tensor (%(listed)s); a quantized model folder's weights "
        "are dequantized to it", metavar="DTYPE",
        listed=castable_dtypes, recipe="dtype", diff=True)
    add_tokens: str | None = _option(  # or a PathLike
        None, "--add-tokens", "tensors", "add the tokens FILE lists (one per line, or a JSON list) to the tokenizer "
        "files written into DST/ and rows to the input embedding and LM head, each new row the mean of the old "
        "ones; config.json's vocab_size follows", metavar="FILE", recipe="add_tokens.file", place=True)
    quantize: str | None = _option(
        None, "--quantize", "tensors", "a compressed-tensors scheme (FP8_DYNAMIC, FP8_BLOCK) writes the Linear "
        "weights F8_E4M3 with their weight_scale and config.json's quantization_config into a DST/ folder (lm_head "
        "and MoE routers kept; a recipe's quantize: changes that, docs/quantizing.md); a ggml type writes a GGUF "
        "DST's 2-D float tensors as that type, a llama.cpp mix picks llama-quantize's type per tensor (1-D tensors "
        "and norms stay F32; a recipe's target.quantize picks per tensor). TYPE: %(listed)s", metavar="TYPE",
        listed=quantize_types, recipe="target.quantize")
    # writing DST
    target_format_name: str = _option(
        "auto", "--to", "output", "DST's format: %(listed)s (default: auto, from DST's extension)",
        metavar="FORMAT", choices=target_formats, recipe="target.format", place=True, plain=True)
    overwrite: bool = _option(False, "--overwrite", "output", "replace an existing target", kind="switch",
                              recipe="target.overwrite", place=True, plain=True)
    fsync: bool = _option(
        True, "--no-fsync", "output", "publish without flushing to disk first (faster, like cp): never partial "
        "after a crash of migrator, but a power loss soon after may lose the new file", kind="off",
        recipe="target.fsync", place=True, plain=True)
    metadata: Mapping[str, str] = _option(
        None, "--metadata", "output", "add a metadata entry (repeatable)", kind="pairs", metavar="KEY=VALUE",
        recipe="target.metadata", place=True, plain=True, factory=dict)
    clear_metadata: bool = _option(
        False, "--no-metadata", "output", "write no metadata except --metadata entries", kind="switch",
        recipe="target.clear_metadata", place=True, plain=True)
    # a folder DST
    max_shard_size: str | int | None = _option(
        None, "--max-shard-size", "folder", "write DST as a folder of shards of at most SIZE (5GB = 5*10^9 bytes, "
        "5GiB = 5*2^30, an integer = bytes) plus an index; a DST/ without it is a Hugging Face folder of 5GB "
        "shards (one model.safetensors when the model fits)", metavar="SIZE", recipe="target.shard.max_size",
        plain=True)
    weights_name: str | None = _option(
        None, "--weights-name", "folder", "the weights' file name in a folder DST/ (default: model.safetensors or "
        "pytorch_model.bin, adapter_model.* for a PEFT adapter; shards are NAME's stem -00001-of-0000N)",
        metavar="NAME", recipe="target.shard.name", plain=True)
    copy: Sequence[str] = _option(
        (), "--copy", "folder", "copy matching companion files (config.json, 'tokenizer*') from the source folder "
        "into a sharded DST (repeatable)", kind="repeat", metavar="GLOB", recipe="target.copy", plain=True)
    copy_from: str | None = _option(  # or a PathLike
        None, "--copy-from", "folder", "the folder --copy globs read from (default: the source's folder), e.g. "
        "the Hugging Face folder whose config.json and tokenizer go with a .bpk source; alone, its usual companions "
        "(config, generation config, tokenizer files, chat template) when present", metavar="DIR",
        recipe="target.copy_from", place=True, plain=True)
    # a GGUF DST
    base: str | None = _option(  # or a PathLike
        None, "--base", "gguf", "SRC a PEFT LoRA adapter folder, DST a .gguf: the base model folder (config.json and "
        "weights, read for the architecture, names and shapes; default: adapter_config.json's "
        "base_model_name_or_path when that is a local folder)", metavar="DIR")
    # training state
    param_order: str | None = _option(  # or a PathLike
        None, "--param-order", "training", "a Hugging Face Trainer checkpoint folder with --training-state keep: a "
        "state dict of the model whose names, in stored order, give its parameters' order (optimizer.pt saves no "
        "names; default: derived with transformers from config.json)", metavar="FILE", recipe="source.param_order",
        place=True)
    training_state: str | None = _option(
        None, "--training-state", "training", "keep (rewritten to follow every rename, split and permute; into a "
        ".pt target, or into a .bpk target as Burn's optimizer record beside the model) or drop (default: keep "
        "for a whole .pt -> .pt run, drop when a top level key selects the model)",
        choices=lambda: TRAINING_STATES, recipe="training_state", place=True)
    optimizer: str | None = _option(  # or a PathLike
        None, "--optimizer-out", "training", "with --training-state keep into a .bpk: where Burn's optimizer "
        "record is written (default: beside DST, <stem>-optim.bpk)", metavar="PATH", recipe="target.optimizer",
        place=True)

    def given(self) -> dict[str, Any]:
        """{field: value} for every option, as `build_recipe` and a plain copy take them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def table() -> tuple[Option, ...]:
    """Every row, in `--help` order within its group, each knowing its field."""
    return tuple(dataclasses.replace(f.metadata["option"], name=f.name) for f in dataclasses.fields(ConvertOptions))


def row(name: str) -> Option:
    """The row of field `name`."""
    return next(r for r in table() if r.name == name)


PLAIN = frozenset(r.name for r in table() if r.plain)
"""Options a plain copy (`run/convert.py`) understands; anything else set goes through a recipe."""

DIFF = tuple(r.name for r in table() if r.diff)
"""The options `diff` takes from convert's for A (B is what convert would write)."""

_POSITIONALS = {"source.path": "SRC", "target.path": "DST"}


def flag_for(location: str) -> str:
    """The option a recipe location comes from, e.g. 'source.lora.scale' -> '--lora/--lora-scale':
    the rows whose `recipe` is the longest prefix of `location` (indices and keys ignored)."""
    import re

    parts = re.sub(r"\[[^\]]*\]", "", location).split(".")  # indices and keys: sources[0], quantize['.*']
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in _POSITIONALS:
            return _POSITIONALS[prefix]
        flags = [r.flag for r in table() if r.recipe == prefix]
        if flags:
            return "/".join(flags)
    return parts[0]

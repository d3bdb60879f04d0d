"""The registered formats (`FormatSpec`s, in order) and every list or question derived from them.

A format is registered once: the built-in ones below, another with `register(spec)`. Nothing else
lists formats: the command line's choices and help (`names`, `choices`), the recipe schema's literals,
the detection message (`formats.detect`), docs/formats.md's table (`docs_table`, checked by a test),
and each stage's question of a format (`spec(name).keeps_structure`, ...) come from here.

Standard library only (the codecs are imported when a reader or writer class is first asked for).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.errors import UnknownFormatError
from .spec import FormatSpec
from .specs import burnpack, dcp, deepspeed, gguf, megatron_legacy, nemo, pytorch, safetensors, torch_dist, trainer

if TYPE_CHECKING:
    from .base import Reader, Writer

AUTO = "auto"
"""The format argument that means "detect it" (a source) or "from the extension" (a target)."""

_SPECS: dict[str, FormatSpec] = {s.name: s for s in (burnpack.SPEC, safetensors.SPEC, pytorch.SPEC, gguf.SPEC,
                                                      dcp.SPEC, torch_dist.SPEC, deepspeed.SPEC, trainer.SPEC,
                                                      megatron_legacy.SPEC, nemo.SPEC)}


def register(format_spec: FormatSpec) -> FormatSpec:
    """Add a format (after the built-in ones); its name must be new. Returns the spec."""
    if format_spec.name in _SPECS or format_spec.name == AUTO:
        raise ValueError(f"format '{format_spec.name}' is already registered")
    _SPECS[format_spec.name] = format_spec
    return format_spec


def unregister(name: str) -> None:
    """Remove a format added by `register` (a test's toy format); a built-in one stays."""
    if _SPECS.get(name) in _BUILT_IN:
        raise ValueError(f"format '{name}' is built in")
    _SPECS.pop(name, None)


def specs() -> tuple[FormatSpec, ...]:
    """Every registered format, in registry order."""
    return tuple(_SPECS.values())


def names(*, readable: bool = False, writable: bool = False, folders: bool = False) -> tuple[str, ...]:
    """The names of the registered formats, in registry order, that have a reader (`readable`), a
    writer (`writable`), or both when both are asked for. Folder formats (DCP, ZeRO: detected from their
    folder, never named as one file's format) are left out unless `folders`, or unless `writable` is asked
    and the format has a writer (`--to dcp` names the folder written).

    `names(readable=True)`: what `--from`, `inspect --format` and a recipe's `source.format` take;
    `names(writable=True)`: what `--to` and `target.format` take (each with `auto`: `choices`)."""
    return tuple(s.name for s in _SPECS.values()
                 if (not readable or s.readable) and (not writable or s.writable)
                 and (folders or not s.folder or (writable and s.writable)))


def choices(*, readable: bool = False, writable: bool = False) -> tuple[str, ...]:
    """`auto` and `names(...)`: the values of a format option or a recipe's `format:`."""
    return (AUTO, *names(readable=readable, writable=writable))


def spec(name: str) -> FormatSpec:
    """The spec of a registered format (an `UnknownFormatError` listing them otherwise)."""
    found = _SPECS.get(name)
    if found is None:
        raise UnknownFormatError(f"unknown format '{name}' (use one of {', '.join(names())})")
    return found


def find(name: str) -> FormatSpec | None:
    """The spec of `name`, or None: a reader's format may also be a source kind (`mixed`, `mergekit`)."""
    return _SPECS.get(name)


def is_format(name: str | None, **facet: object) -> bool:
    """Whether `name` is a registered format with every given facet (`is_format(f, keeps_structure=True)`);
    False for a name that is no format (`mixed`, `auto`)."""
    found = None if name is None else _SPECS.get(name)
    return found is not None and all(getattr(found, k) == v for k, v in facet.items())


def has_torch_names(reader: Reader) -> bool:
    """Whether the reader's names are a torch module's state-dict keys (a `.pt`, rank files, a DCP folder:
    `FormatSpec.torch_names`): Burn's PyTorch defaults (contiguous indices, enum variants skipped) apply."""
    return is_format(reader.format, torch_names=True)


def reader_class(fmt: str) -> type[Reader]:
    return spec(fmt).reader_class()


def writer_class(fmt: str) -> type[Writer]:
    found = spec(fmt)
    if found.writer is None:
        raise UnknownFormatError(f"{found.title} is read only: write one of {', '.join(names(writable=True))}")
    return found.writer_class()


def by_extension(path: str | os.PathLike[str]) -> str | None:
    """The format a file's extension names (`.pth` -> pytorch), or None."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if not suffix:
        return None
    return next((s.name for s in _SPECS.values() if suffix in s.extensions), None)


def extension_less() -> FormatSpec:
    """The format of a target path with no extension: Burn's (its writer appends the extension)."""
    return next(s for s in _SPECS.values() if s.for_burn and s.writable)


def default_sharded() -> FormatSpec:
    """The format of a folder of shards when neither the format nor an extension says: the first with
    an index (SafeTensors, what Hugging Face writes)."""
    return next(s for s in _SPECS.values() if s.shard_names is not None and s.shard_names[1] and s.writable)


def target_format(path: str | os.PathLike[str], explicit: str = AUTO, *, sharded: bool = False) -> str:
    """The one rule for an output's format: `explicit` unless `auto`; else its extension's; else, for
    a path with no extension, Burn's format for one file (Burn appends `.bpk`) and SafeTensors for a
    folder of shards (`sharded`). An extension no writer takes is refused, naming the path."""
    if explicit != AUTO:
        found = spec(explicit)
        if found.writer is None:
            writer_class(explicit)  # raises: read only
        return found.name
    text = os.fspath(path)
    suffix = os.path.splitext(os.path.basename(text.rstrip("/" + os.sep) if sharded else text))[1]
    fmt = by_extension(text.rstrip("/" + os.sep)) if suffix else None
    if fmt is not None:
        if not spec(fmt).writable:
            writer_class(fmt)  # raises: the extension of a format read only
        return fmt
    if sharded:
        return default_sharded().name
    if suffix == "":
        return extension_less().name
    exts = ", ".join(s.extension for s in _SPECS.values() if s.writable)
    raise UnknownFormatError(f"cannot tell the output format from extension '{suffix}'; use {exts}, or name the format",
                             file=text)


def target_is(path: str | os.PathLike[str], explicit: str = AUTO, **facet: object) -> bool:
    """Whether the output `path` (a folder when it ends with `/`) is in a format with every given facet
    (`target_is(dst, "auto", llama_cpp=True)`); False when its format cannot be told."""
    try:
        fmt = target_format(path, explicit, sharded=os.fspath(path).endswith(("/", os.sep)))
    except UnknownFormatError:
        return False
    return is_format(fmt, **facet)


def not_shardable(fmt: str) -> str | None:
    """Why `fmt` cannot be written as a folder of shards (the problem, then after `; ` what to write
    instead), or None when it can."""
    found = spec(fmt)
    if found.shard_names is not None:
        return None
    if found.folder:
        return (f"a sharded target cannot be {found.name}: a {found.title} is a folder of its own files, written "
                f"whole; name the folder as the target (format {found.name})")
    why = "Burn has one file per model" if found.for_burn else "it is one file per model"
    shardable = [s.name for s in _SPECS.values() if s.shard_names is not None and s.writable]
    return (f"a sharded target cannot be {found.name}: {why} (a {found.extension} holds the whole model); "
            f"write {listed(shardable)} shards")


def listed(items: Sequence[str], last: str = "or") -> str:
    """`a, b or c` (`last="and"`: `a, b and c`): names in a sentence."""
    return ", ".join(items[:-1]) + f" {last} " + items[-1] if len(items) > 1 else "".join(items)


def docs_table() -> str:
    """docs/formats.md's table of formats (a test keeps the page equal to it)."""
    rows = ["| format | files | detected by | read | written |", "| --- | --- | --- | --- | --- |"]
    for s in _SPECS.values():
        files = ", ".join(f"`{e}`" for e in s.extensions) or "a folder"
        rows.append(f"| {s.summary} | {files} | {s.recognized_by} | yes | {'yes' if s.writable else 'no'} |")
    return "\n".join(rows) + "\n"


_BUILT_IN = tuple(_SPECS.values())

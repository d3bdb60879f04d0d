"""Sharded outputs: Hugging Face's model-folder layout, split exactly as `huggingface_hub` splits.

`split_shards` walks the tensors in output order and starts a new shard when the next tensor would
push the current one past the limit; a tensor larger than the limit gets a shard of its own, placed
where it is met, while the current shard keeps filling (huggingface_hub's
`split_state_dict_into_shards_factory`, whose result the tests compare against). Shards are named
`model-00001-of-00003.safetensors` (`pytorch_model-...bin` for PyTorch) with an index
`model.safetensors.index.json`; a model that fits one shard is one `model.safetensors` and no index,
as `save_pretrained` writes it.

Tied tensors (two names over the same stored bytes, as torch saves `lm_head.weight` and
`wte.weight` of a model that ties them) are grouped as huggingface_hub groups tensors sharing a
storage: the first one met is placed and counted, the others join its shard (after its tensors)
and add nothing to its size nor to the index's `total_size`. A PyTorch shard then writes them as
one storage again. Ties are the PyTorch writer's: the same bytes of one file with the same dtype; a
tensor that views only part of another's storage is not grouped (huggingface_hub would group it).
"""

from __future__ import annotations

import glob as globlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..core.errors import PlanError
from ..core.scalars import Scalar
from ..core.tensor import LazyTensor
from ..formats.base import Writer, WriterKind
from .shard_layout import DEFAULT_MAX_SIZE, parse_size, weights_patterns

if TYPE_CHECKING:
    from ..storage.atomic import Protected
    from ..storage.atomic_folder import FolderScratch
    from ..storage.remote.options import StorageOptions

def copy_folder(folder: Path, target: Path) -> Path:
    """`target.copy_from` / `--copy-from`: a folder that is not the target nor inside it (the run
    replaces the target: its companions would be read from what is being replaced)."""
    from ..storage.remote import is_url

    if not is_url(folder) and not is_url(target):
        f, t = os.path.realpath(folder), os.path.realpath(target)
        if f == t or f.startswith(t.rstrip(os.sep) + os.sep):
            raise PlanError(f"target.copy_from {folder} is the target folder or inside it: copy companions from "
                            "the model they belong to", file=str(folder))
        if not os.path.isdir(f):
            raise PlanError(f"target.copy_from {folder} is not a folder", file=str(folder))
    return folder


def default_weights_name(fmt: str, source_folder: Path | None) -> str | None:
    """None (Hugging Face's model names) unless the source is a PEFT adapter folder, whose weights
    `save_pretrained` names `adapter_model.safetensors` / `adapter_model.bin`: its output keeps them."""
    from ..formats.registry import find

    found = find(fmt)
    # the Hugging Face folder formats (an index beside the shards) are PEFT's
    if source_folder is None or not isinstance(source_folder, Path) or not (found and found.shard_names
                                                                            and found.shard_names[1]):
        return None
    try:
        adapter = (source_folder / "adapter_config.json").is_file() and any(
            (source_folder / f"adapter_model{ext}").is_file() for ext in (".safetensors", ".bin"))
    except OSError:
        return None
    return "adapter_model" + os.path.splitext(found.shard_names[0])[1] if adapter else None


def tie_key(t: LazyTensor) -> tuple[object, int, int, str] | None:
    """What makes two tensors tied (see the module docstring), or None for a tensor of its own."""
    if t.span is None:
        return None
    from ..formats.pytorch_writer import span_key

    return span_key(t)


def tied_followers(tensors: Sequence[LazyTensor]) -> dict[int, LazyTensor]:
    """id() of each tensor tied to an earlier one -> that earlier one (the first of its group)."""
    first: dict[tuple[object, int, int, str], LazyTensor] = {}
    out: dict[int, LazyTensor] = {}
    for t in tensors:
        key = tie_key(t)
        if key is None:
            continue
        leader = first.setdefault(key, t)
        if leader is not t:
            out[id(t)] = leader
    return out


def split_shards(tensors: Sequence[LazyTensor], max_size: int) -> list[list[LazyTensor]]:
    """huggingface_hub's split of `tensors` (in order) into shards of at most `max_size` bytes."""
    shards: list[list[LazyTensor]] = []
    current: list[LazyTensor] = []
    size = 0
    followers = tied_followers(tensors)
    joining: dict[int, list[LazyTensor]] = {}  # id() of a group's first tensor -> the others
    for t in tensors:
        leader = followers.get(id(t))
        if leader is not None:
            joining.setdefault(id(leader), []).append(t)
            continue
        if t.nbytes > max_size:
            shards.append([t])
            continue
        if size + t.nbytes > max_size:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += t.nbytes
    if current:
        shards.append(current)
    if joining:
        for shard in shards:
            shard.extend([f for t in list(shard) for f in joining.get(id(t), ())])
    return shards


def resolve_copies(entries: Sequence[tuple[str, bool]], folder: Path, reserved: set[str],
                   storage: StorageOptions | None = None) -> list[tuple[Path, str]]:
    """Companion files to copy: (file, name in the output) per match of each (glob, optional) entry.

    Globs are relative to the source's folder and may not leave it: a pattern with `..` (also
    percent-encoded) or an absolute one is refused, and so is a match that resolves out of the folder
    through a link (`sharded.resolves_inside`: a Hugging Face cache snapshot's links into its
    repository's blobs are inside). Weight files and indexes are never companions: a glob skips them,
    an entry naming one is an error. A required entry matching no file, and a match that would replace
    a written shard or index, are errors. A folder on an object store is listed through fsspec (with
    its options from `storage`), and its matches are `RemotePath`s (their URLs).
    """
    from ..storage.remote import is_url, redact
    from .sharded import GLOB_CHARS, is_weights_file, name_problem, resolves_inside

    out: dict[str, Path] = {}
    for pattern, optional in entries:
        problem = name_problem(pattern, url=is_url(folder))
        if problem is not None:
            raise PlanError(f"target.copy: '{pattern}' leaves the source folder {redact(str(folder))}: {problem}")
        if is_url(folder):
            from .remote_sharded import glob_companions

            found = glob_companions(str(folder), pattern, storage)
        else:
            found = []
            for m in sorted(globlib.glob(globlib.escape(str(folder)) + "/" + pattern)):
                if not os.path.isfile(m):
                    continue
                if not resolves_inside(m, folder):
                    raise PlanError(f"target.copy: '{os.path.relpath(m, folder)}' leaves the source folder {folder} "
                                    f"(it resolves to {os.path.realpath(m)})")
                found.append((Path(m), os.path.relpath(m, folder)))
        weights = [rel for _, rel in found if is_weights_file(rel)]
        if weights and not GLOB_CHARS.intersection(pattern):
            raise PlanError(f"target.copy: '{pattern}' is a weight file or an index, never a companion file: the "
                            "output's weights are the tensors migrator writes")
        found = [(m, rel) for m, rel in found if not is_weights_file(rel)]
        if not found and weights and not optional:
            raise PlanError(f"target.copy: '{pattern}' matches only weight files or indexes "
                            f"({', '.join(weights[:3])}), which are never companion files")
        if not found and not optional:
            raise PlanError(f"target.copy: no file in {folder} matches '{pattern}' (mark it optional: "
                            f"{{path: '{pattern}', optional: true}} if it may be absent)")
        for match, rel in found:
            if rel in reserved:
                raise PlanError(f"target.copy: '{rel}' would replace a file migrator writes in the output folder")
            out[rel] = match
    return [(p, rel) for rel, p in out.items()]


CONFIG_DTYPE_KEYS = ("dtype", "torch_dtype")
"""Where a Hugging Face config.json says its weights' dtype (transformers 5 writes `dtype`, 4 wrote
`torch_dtype`); from_pretrained builds the model in that dtype when asked for `dtype="auto"`."""


def config_with_dtype(source: Path, tensors: Sequence[LazyTensor], update: Mapping[str, Any] | None = None,
                      drop: Sequence[str] = (), storage: StorageOptions | None = None) -> tuple[bytes, str] | None:
    """A companion config.json rewritten to say the dtype the written float tensors have, when it
    says another (a cast model would otherwise load as its old dtype), and with `update`'s entries
    (a merge's `num_hidden_layers`, a recipe's `target.config`; None removes the key) set and `drop`'s
    keys removed (a dequantized source's `quantization_config`): (new bytes, a note), or None when
    nothing changes (it agrees or says no dtype, or the floats are of several dtypes). A file on an
    object store is read with `storage`."""
    from ..storage.remote import is_url
    from .model_config import ConfigError, load_config, remote_config

    if not isinstance(source, Path):
        return None
    if is_url(source):
        remote = remote_config(source, storage)
        if remote is None:
            return None  # copied as it is, as any companion
        config = remote
    else:
        try:
            config = load_config(source)
        except ConfigError:
            return None  # copied as it is, as any companion
    notes = []
    dropped = [k for k in drop if k in config]
    for k in dropped:
        del config[k]
    if dropped:
        notes.append(f"config.json is written without {', '.join(dropped)} (its weights are written dequantized)")
    changed = {k: v for k, v in (update or {}).items() if config.get(k) != v or (v is None and k in config)}
    if changed:
        config.update({k: v for k, v in changed.items() if v is not None})
        for k in [k for k, v in changed.items() if v is None]:  # a recipe's null removes the key
            config.pop(k, None)
        notes.append("config.json is written with " + ", ".join(  # a mapping (quantization_config) unspelt
            f"{k} removed" if v is None else f"{k}: {json.dumps(v) if not isinstance(v, dict) else '{...}'}"
            for k, v in changed.items()))
    floats = {t.dtype.torch_name for t in tensors if t.dtype.is_float and t.dtype.torch_name}
    wide = {f for f in floats if not f.startswith("float8")}  # FP8 weights (and their scales) say nothing of it
    floats = wide or floats
    if len(floats) == 1:
        (written,) = floats
        said = {k: config[k] for k in CONFIG_DTYPE_KEYS if isinstance(config.get(k), str)}
        if said and not all(v == written for v in said.values()):
            config.update(dict.fromkeys(said, written))
            old = ", ".join(f"{k}: {v}" for k, v in said.items())
            notes.append(f"config.json said {old}; it is written saying {written}, the dtype of the weights written")
    if not notes:
        return None
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(), "; ".join(notes)


@dataclass(frozen=True)
class FolderLayout:
    """What a folder target holds beside its tensors' bytes: the shards' size limit (`max_size`) and
    weights name (`weights_name`, None: Hugging Face's), the companion files copied (`copies`: (glob,
    optional) entries, `resolve_copies`, from `copy_from`; none without it), the entries set in a copied
    config.json (`config_update`) and the keys removed from it (`config_drop`), the companion files
    written from these bytes (`generated`: (name, content), in place of a copy of the same name), and
    the options companion files on an object store are listed and read with (`storage`)."""

    max_size: int | str = DEFAULT_MAX_SIZE
    weights_name: str | None = None
    copies: Sequence[tuple[str, bool]] = ()
    copy_from: Path | None = None
    config_update: Mapping[str, Any] | None = None
    config_drop: Sequence[str] = ()
    generated: Sequence[tuple[str, bytes]] = ()
    storage: StorageOptions | None = None


DEFAULT_FOLDER = FolderLayout()


class ShardedWriter(Writer):
    """A folder of shard files (each planned by its format's writer), an index and companion files."""

    default_extension = ""
    kind = WriterKind.FOLDER

    def __init__(self, fmt: str, tensors: Sequence[LazyTensor], *, metadata: Mapping[str, str] | None = None,
                 scalars: Mapping[str, Scalar] | None = None, folder: FolderLayout = DEFAULT_FOLDER,
                 quantize: Mapping[str, str] | str | None = None) -> None:
        """`folder`: the shards' size and name and the companion files (`FolderLayout`); `quantize`: a
        GGUF target's rules or llama.cpp mix name (its files are llama.cpp's split layout,
        `formats.gguf.writer.split_writers`)."""
        super().__init__(tensors, metadata=metadata, scalars=scalars)
        from ..formats.registry import is_format, not_shardable, writer_class

        why = not_shardable(fmt)
        if why is not None:
            raise PlanError(why)
        self.format = fmt  # type: ignore[misc]  # the shards' format
        self.max_size = parse_size(folder.max_size)
        pattern, index_name = weights_patterns(fmt, folder.weights_name)
        self.index: dict[str, Any] | None = None
        self.index_name = index_name
        if is_format(fmt, llama_cpp=True):  # llama.cpp's split files
            groups = self._gguf_files(pattern, metadata, quantize)
            n = 1  # no index
        else:
            groups = split_shards(self.tensors, self.max_size) or [[]]
            n = len(groups)
            names = [pattern.format(suffix="")] if n == 1 else [pattern.format(suffix=f"-{i + 1:05d}-of-{n:05d}")
                                                                 for i in range(n)]
            cls = writer_class(fmt)
            self.files: list[tuple[str, Writer]] = [(name, cls(group, metadata=metadata, scalars=scalars))
                                                    for name, group in zip(names, groups, strict=True)]
        names = [name for name, _ in self.files]
        if n > 1:
            weight_map = {t.name: name for name, group in zip(names, groups, strict=True) for t in group}
            followers = tied_followers(self.tensors)  # stored once, counted once (as huggingface_hub counts)
            stored = [t for t in self.tensors if id(t) not in followers]
            # as transformers' save_pretrained writes it: parameters and bytes of the stored tensors
            self.index = {"metadata": {"total_parameters": sum(t.numel for t in stored),
                                       "total_size": sum(t.nbytes for t in stored)}, "weight_map": weight_map}
        reserved = set(names) | ({index_name} if self.index is not None else set())
        self.storage = storage = folder.storage
        copies, copy_from = folder.copies, folder.copy_from
        self.copies = resolve_copies(copies, copy_from, reserved, storage) if copies and copy_from is not None else []
        self.companion_sources = [src for src, _ in self.copies]  # read by the run: no output may replace one
        # companions written from these bytes, not copied (a GGUF's config.json, a merge's): in place of a
        # copy of the same name; a copied config.json whose dtype the cast changed joins them below
        self.generated: list[tuple[str, bytes]] = list(folder.generated)
        self.copies = [(src, rel) for src, rel in self.copies if rel not in {name for name, _ in folder.generated}]
        for src, rel in list(self.copies):
            if rel == "config.json" and (updated := config_with_dtype(src, self.tensors, folder.config_update,
                                                                      folder.config_drop, storage)) is not None:
                self.copies.remove((src, rel))
                self.generated.append((rel, updated[0]))
                self.notes.append(updated[1])

    def _gguf_files(self, pattern: str, metadata: Mapping[str, str] | None,
                    quantize: Mapping[str, str] | str | None) -> list[list[LazyTensor]]:
        """llama.cpp's split files (`NAME-00001-of-0000N.gguf`, numbered even when one): self.files, and
        the tensors of each."""
        from ..formats.gguf.writer import split_writers

        if self.scalars:
            raise PlanError(f"GGUF has no typed scalars ({', '.join(sorted(self.scalars))}); drop them "
                            "(target.scalars: none) or store them as metadata")
        stem = pattern.split("{suffix}", 1)[0].replace("{{", "{").replace("}}", "}")
        files, notes = split_writers(self.tensors, self.max_size, stem, metadata=metadata, quantize=quantize)
        self.files = list(files)
        self.notes += notes
        return [list(w.tensors) for _, w in files]

    def names(self) -> list[str]:
        """The files the output folder holds: shards, the index (if any), companion files."""
        return ([name for name, _ in self.files] + ([self.index_name] if self.index is not None else [])
                + [name for _, name in self.copies] + [name for name, _ in self.generated])

    def index_bytes(self) -> bytes:
        """The index as `save_pretrained` writes it: sorted keys, two-space indent."""
        return (json.dumps(self.index, indent=2, sort_keys=True) + "\n").encode()

    @property
    def total_size(self) -> int:
        return sum(w.total_size for _, w in self.files)

    def write_to(self, sink: BinaryIO) -> None:
        raise TypeError("a sharded output is a folder: save it with files.io.save_planned")

    @staticmethod
    def resolve_path(path: str | os.PathLike[str]) -> str:
        return os.path.normpath(os.fspath(path))


def save_sharded(writer: ShardedWriter, path: str | os.PathLike[str], *, overwrite: bool = False,
                 progress: Callable[[BinaryIO, int], AbstractContextManager[None]] | None = None,
                 fsync: bool = True, protect: Iterable[Protected] = (), outputs: Iterable[str | os.PathLike[str]] = (),
                 mode_from: Iterable[str | os.PathLike[str] | int] = ()) -> str:
    """Write a `ShardedWriter`'s shards, index and companion files as one folder, atomically
    (`protect`, `outputs`, `mode_from`: as `atomic_folder`)."""
    from ..storage.atomic_folder import atomic_folder
    from .sharded import model_parts

    out = writer.resolve_path(path)
    with atomic_folder(out, overwrite=overwrite, fsync=fsync, protect=protect, outputs=outputs,
                       mode_from=mode_from, names=writer.names(), owned=model_parts) as folder:
        for name, shard in writer.files:
            with folder.file(name, shard.total_size) as sink:
                if progress is None:
                    shard.write_to(sink)
                else:
                    with progress(sink, shard.total_size):
                        shard.write_to(sink)
        finish_folder(folder, writer)
    return out


def finish_folder(folder: FolderScratch, writer: ShardedWriter) -> None:
    """After the shards: the index (when the layout has one) and the companion files, into `folder`."""
    if writer.index is not None:
        data = writer.index_bytes()
        with folder.file(writer.index_name, len(data)) as sink:
            sink.write(data)
    for src, name in writer.copies:
        folder.copy(src, name, writer.storage)
    for name, data in writer.generated:
        with folder.file(name, len(data)) as sink:
            sink.write(data)

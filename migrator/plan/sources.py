"""Several checkpoints read as one source (a recipe's `sources:` list): model surgery.

Each entry is opened as `source:` would be (a file, a model folder, an index, a glob), then its
tensors go through its own steps, in this order: its `filter` (on the names as the checkpoint
stores them, so a layer range can be cut before it is renumbered), its `remap` rules, contiguous
indices (its `contiguous_indices`, default on for a PyTorch file, as for `source:`), then its
`prefix` (verbatim). `UnionReader` lists every entry's kept tensors, in entry
order, under those names: the recipe's global remap, filter, modules, adapters, dtype and target
then treat the union as one source.

What holds once a `UnionReader` exists, else a `PlanError` naming the sources, their tensors and
(when the recipe was loaded from a file) their recipe lines: no two entries give one name; no entry's
own remap maps two of its tensors onto one name. Each union tensor remembers its entry and its name
in that entry's checkpoint (`origin_of`), so reports can say where a skipped or unused tensor came
from. Metadata is the entries where every source agrees; scalars must agree where two sources have one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.bytesource import ByteSource
from ..core.dtypes import DType
from ..core.errors import AdapterError, FormatError, PlanError, TensorNotFoundError
from ..core.scalars import Scalar
from ..core.tensor import LazyTensor
from ..formats.base import Reader
from ..formats.registry import has_torch_names
from ..naming import KeyRemapper, NamingError, RemapRule, contiguous_names, find_collisions
from ..storage.paths import resolve_path
from ..storage.read_context import DEFAULT_READ, ReadContext
from ..storage.remote.options import StorageOptions

if TYPE_CHECKING:
    from ..recipe.model import Recipe, SourceEntry, SourceSpec
    from .report import ApplyReport

MAX_LISTED = 5
"""Collisions named in one error (the count of the rest follows)."""


class SourceKeyError(PlanError):
    """`source.top_level_key` selects nothing (the message lists what there is, with a did-you-mean)."""

    loc = ("source", "top_level_key")


def open_source(spec: SourceSpec, path: Path, entry: int | None = None, *, read: ReadContext = DEFAULT_READ,
                keep_structure: bool = False, base_dir: Path | None = None,
                training_state: str | None = None, dequantize: DType | None = None) -> Reader:
    """One `source:` (or `sources:` entry number `entry`) opened within `read`, headers only; a wrong
    top_level_key is a `SourceKeyError` that points at that key. `keep_structure`: a PyTorch
    checkpoint keeps the containers around its tensors (`reader.structure`), for a PyTorch target;
    with `training_state="keep"` too, a DeepSpeed ZeRO folder is the whole training checkpoint.
    A model folder whose config.json declares a quantization scheme is read through
    `files.quantized`: stored, or dequantized to `dequantize` (the dtype policy's cast). With `lora:`,
    the reader lists the base's tensors (dequantized first) with the adapter folded in (the adapter's
    path taken from `base_dir`)."""
    from ..files.io import open_file

    if spec.format == "mergekit":
        from ..transform.merging.merged import MergedReader

        if spec.lora is not None:
            raise PlanError("a mergekit source takes no lora: (write model: PATH+ADAPTER in the config)",
                            file=str(path))
        return MergedReader(path, seed=spec.seed)
    if spec.seed is not None:
        raise PlanError("source.seed is the seed of a merge's random drop: it needs format: mergekit",
                        file=str(path))
    key = spec.top_level_key
    options: dict[str, Any] = read.options() if key is None else {**read.options(), "top_level_key": key}
    if spec.tag is not None:  # the step of a DeepSpeed ZeRO checkpoint
        options["tag"] = spec.tag
    if dequantize is not None:  # a quantized model folder's weights (files.quantized)
        options["dequantize"] = dequantize
    if spec.param_order is not None:  # a Trainer checkpoint's parameter order
        options["param_order"] = spec.param_order if base_dir is None else resolve_path(base_dir, spec.param_order)
    if keep_structure:
        options["keep_structure"] = True
        if training_state is not None:
            options["training_state"] = training_state
    try:
        reader = open_file(path, spec.format, **options)
    except TensorNotFoundError as e:
        error = SourceKeyError(e.detail, file=e.file)
        if entry is not None:
            error.loc = ("sources", entry, "top_level_key")  # type: ignore[assignment]
        raise error from None
    lora = spec.lora_adapter()
    if lora is None:
        return reader
    from ..files.quantized import QuantizedReader

    if isinstance(reader, QuantizedReader) and reader.dequantize is None:  # its codes are no weights to add to
        reader.close()
        raise PlanError(f"a LoRA adapter is folded into weights, and {reader.config_path} declares this base "
                        f"quantized ({reader.scheme.describe()}): give a dtype (--dtype BF16, F16 or F32, or "
                        "dtype: {cast: ...}) to dequantize it first", file=str(path))
    from ..transform.merging.folded import open_folded

    adapter = lora[0] if base_dir is None else resolve_path(base_dir, lora[0])
    if not os.path.exists(adapter):
        from ..recipe.mergekit import HUB_ID

        if HUB_ID.match(os.fspath(lora[0])):
            reader.close()
            raise AdapterError(f"'{lora[0]}' is a Hugging Face hub id: migrator reads local adapter folders; download "
                               f"it first (huggingface-cli download {lora[0]} --local-dir DIR) and give DIR",
                               file=os.fspath(lora[0]))
    return open_folded(reader, adapter, lora_scale=lora[1])


LORA_TENSOR = re.compile(r"\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)(\.|$)")
"""A PEFT adapter's own tensor names: they mean nothing in a model until folded."""


def check_unfolded_adapters(parts: Sequence[SourcePart], entries: Sequence[SourceEntry]) -> None:
    """Refuse a `sources:` union that would write a LoRA adapter's A/B matrices beside a model's weights,
    unmerged (easy to take for a merged model). The entry's `lora:` folds it; a `prefix` keeps its
    tensors apart on purpose (e.g. for a `lora_fold` op)."""
    if len(parts) < 2:
        return
    for part, entry in zip(parts, entries, strict=True):
        if entry.prefix or entry.lora is not None:
            continue
        found = [t.name for t in part.reader.tensors if LORA_TENSOR.search(t.name)]
        if found:
            more = f" and {len(found) - 1} more" if len(found) > 1 else ""
            raise PlanError(f"source '{part.label}' holds LoRA adapter tensors ('{found[0]}'{more}): joined with "
                            "the other sources they would be written unmerged, not folded into the model; to fold "
                            "the adapter into its base, give the base's entry lora: ADAPTER_FOLDER (and drop this "
                            "entry); to keep its tensors apart on purpose, give this entry a prefix",
                            file=str(part.path))


@dataclass
class SourcePart:
    """One entry of `sources:`, opened: its reader, and where the recipe declares it."""

    label: str
    path: Path
    reader: Reader
    where: str | None = None  # 'recipe.yaml:LINE:COL' of the entry, when known

    def describe(self, tensor: str) -> str:
        at = f" ({self.where})" if self.where else ""
        return f"'{tensor}' of source '{self.label}'{at}"


class _Union(ByteSource):
    """The union's `source`: a label naming every part (bytes are read through each part's reader)."""

    def __init__(self, label: str, size: int) -> None:
        self.label = label
        self.path = label
        self.size = size

    def view(self, offset: int, length: int) -> memoryview:
        raise FormatError("several sources have no single byte range; read their tensors", file=self.label)


@dataclass(slots=True)
class Origin:
    """Where a union tensor comes from: the index of its part and its name in that part's checkpoint."""

    part: int
    tensor: str


@dataclass
class Skipped:
    """A tensor an entry's own filter left out: its name (as stored), its part, its name again."""

    name: str
    part: int
    tensor: str


class UnionReader(Reader):
    """Every part's kept tensors as one source (see the module docstring)."""

    format = "mixed"  # set per instance: the parts' format when they agree

    def __init__(self, parts: Sequence[SourcePart], entries: Sequence[SourceEntry], *, for_burn: bool = False) -> None:
        self.parts = list(parts)
        self.for_burn = for_burn  # the output is for Burn: PyTorch parts are renumbered by default
        self.renumbered: list[tuple[str, str]] = []  # (union name before, after) per renumbered tensor
        self.tensors: list[LazyTensor] = []
        self.origin_of: dict[str, Origin] = {}
        self.skipped: list[Skipped] = []
        formats = {p.reader.format for p in self.parts}
        self.format = formats.pop() if len(formats) == 1 else "mixed"  # type: ignore[misc]
        first = self.parts[0]
        self.folder = first.reader.folder or first.path.parent  # where target.copy looks
        self.source = _Union(" + ".join(p.label for p in self.parts), sum(p.reader.source.size for p in self.parts))
        clashes: dict[str, list[tuple[int, str]]] = {}
        for i, (part, entry) in enumerate(zip(self.parts, entries, strict=True)):
            for t, final in self._renamed(part, entry, i):
                seen = self.origin_of.get(final)
                if seen is not None:
                    clashes.setdefault(final, [(seen.part, seen.tensor)]).append((i, t.name))
                    continue
                self.origin_of[final] = Origin(i, t.name)
                self.tensors.append(t if final == t.name else t.renamed(final))
        if clashes:
            lines = [f"'{name}' <- " + " and ".join(self.parts[p].describe(t) for p, t in who)
                     for name, who in list(clashes.items())[:MAX_LISTED]]
            more = f"; and {len(clashes) - MAX_LISTED} more" if len(clashes) > MAX_LISTED else ""
            raise PlanError("two sources give the same name: " + "; ".join(lines) + more
                            + " (give one a prefix or a filter)", file=self.source.label)
        self.metadata = _agreed(p.reader.metadata for p in self.parts)
        self.notes = [f"source '{p.label}': {n}" for p in self.parts for n in p.reader.notes]
        self.consumed = [(f"{p.label}: {t}", into) for p in self.parts for t, into in p.reader.consumed]
        self.scalars = self._scalars()

    def _renamed(self, part: SourcePart, entry: SourceEntry, index: int) -> list[tuple[LazyTensor, str]]:
        """(tensor, union name) per kept tensor of `part`; the filtered-out go to `self.skipped`."""
        from ..naming import NameFilter

        include = NameFilter(entry.filter.include) if entry.filter.include is not None else None
        exclude = NameFilter(entry.filter.exclude) if entry.filter.exclude else None
        kept: list[LazyTensor] = []
        for t in part.reader.tensors:
            if (include is not None and not include(t.name)) or (exclude is not None and exclude(t.name)):
                self.skipped.append(Skipped(t.name, index, t.name))
            else:
                kept.append(t)
        names = [t.name for t in kept]
        current = names
        if entry.remap:
            remapper = KeyRemapper([RemapRule(r.from_, r.to, r.syntax) for r in entry.remap])
            try:
                current = [remapper.remap_name(n) for n in names]
            except NamingError as e:
                raise PlanError(f"remap of source '{part.label}': {e}", file=part.label) from None
        contiguous = entry.contiguous_indices
        if contiguous is None:
            contiguous = self.for_burn and has_torch_names(part.reader)
        if contiguous:
            mapped = contiguous_names(current)
            self.renumbered += [(entry.prefix + old, entry.prefix + new)
                                for old, new in zip(current, mapped, strict=True) if new is not old and new != old]
            current = mapped
        if len(set(current)) != len(current):
            collisions = find_collisions(zip(current, names, strict=True))
            lines = [f"'{new}' <- {', '.join(repr(o) for o in origs)}" for new, origs in sorted(collisions.items())]
            raise PlanError(f"source '{part.label}': several tensors map to the same name after its remap/indices: "
                            + "; ".join(lines[:MAX_LISTED]), file=part.label)
        return [(t, entry.prefix + new) for t, new in zip(kept, current, strict=True)]

    def _scalars(self) -> dict[str, Scalar]:
        out: dict[str, Scalar] = {}
        owner: dict[str, str] = {}
        for p in self.parts:
            for k, v in p.reader.scalars.items():
                if k in out and out[k] != v:
                    raise PlanError(f"scalar '{k}' differs between sources '{owner[k]}' and '{p.label}'",
                                    file=self.source.label)
                out[k], owner[k] = v, p.label
        return out

    def label_of(self, name: str) -> str | None:
        """The source label of union tensor `name`."""
        o = self.origin_of.get(name)
        return None if o is None else self.parts[o.part].label

    def file_readers(self) -> list[Reader]:
        return [f for p in self.parts for f in p.reader.file_readers()]  # a source may read several files

    def describe(self, name: str) -> str:
        """`name` as an error should show it: its original name and its source."""
        o = self.origin_of.get(name)
        return repr(name) if o is None else self.parts[o.part].describe(o.tensor)

    def extra(self) -> dict[str, Any]:
        return {"sources": [{"name": p.label, "path": str(p.path), "format": p.reader.format,
                             "tensors": len(p.reader.tensors)} for p in self.parts]}

    def close(self) -> None:
        for p in self.parts:
            p.reader.close()


def _agreed(metas: Any) -> dict[str, str]:
    """The metadata entries every source has with one value."""
    metas = list(metas)
    if not metas:
        return {}
    out = dict(metas[0])
    for m in metas[1:]:
        out = {k: v for k, v in out.items() if m.get(k) == v}
    return out


def open_sources(recipe: Recipe, base_dir: Path, origins: Mapping[int, str] | None = None, *,
                 read: ReadContext = DEFAULT_READ, for_burn: bool = False) -> UnionReader:
    """Open every `sources:` entry and join them; `origins` maps an entry's index to its recipe line,
    each entry's reader is opened within `read` as `source:`'s, `for_burn` (the output is for Burn)
    turns on the renumbering of PyTorch parts that do not say."""
    assert recipe.sources is not None
    parts: list[SourcePart] = []
    try:
        for i, entry in enumerate(recipe.sources):
            path = resolve_path(base_dir, entry.path)
            opened = open_source(entry, path, i, read=read, base_dir=base_dir, dequantize=cast_of(recipe))
            parts.append(SourcePart(entry.label, path, opened, (origins or {}).get(i)))
        check_unfolded_adapters(parts, recipe.sources)
        return UnionReader(parts, recipe.sources, for_burn=for_burn)
    except BaseException:
        for p in parts:
            p.reader.close()
        raise


def cast_of(recipe: Recipe) -> DType | None:
    """The dtype the recipe's dtype policy casts every float tensor to (what a quantized source is
    dequantized to), or None."""
    from ..core import dtypes
    from ..recipe.model import CastSpec

    return dtypes.parse(recipe.dtype.cast) if isinstance(recipe.dtype, CastSpec) else None


def skip_enum_variants(recipe: Recipe, is_pytorch: bool) -> bool:
    """Whether template lookups drop enum-variant segments: an entry's explicit choice (any true
    wins), else the default for the source's format (on for PyTorch)."""
    explicit = [s.skip_enum_variants for s in recipe.inputs() if s.skip_enum_variants is not None]
    return any(explicit) if explicit else is_pytorch


OP_OUTPUT = "(ops)"
"""The source named for a tensor an op made (it may join tensors of several sources)."""


def add_provenance(report: ApplyReport, union: UnionReader, skipped: Sequence[tuple[str, str]],
                   unused: Sequence[tuple[str, str]]) -> None:
    """Fill the report's `applied_from`, `skipped_from` and `unused_from` (a source label per tensor).

    `skipped`/`unused`: (reported name, union name) pairs. The entries' own filter skips join
    `skipped` here, under their stored names."""
    def triple(name: str, union_name: str) -> tuple[str, str, str]:
        o = union.origin_of.get(union_name)
        return (name, OP_OUTPUT, union_name) if o is None else (name, union.parts[o.part].label, o.tensor)

    report.applied_from = [triple(s, s)[1] for s in report.sources]
    report.skipped_from = sorted([triple(n, u) for n, u in skipped]
                                 + [(s.name, union.parts[s.part].label, s.tensor) for s in union.skipped])
    report.skipped = [n for n, _, _ in report.skipped_from]
    report.unused_from = sorted(triple(n, u) for n, u in unused)


SOURCE_FILES_HASH_KEY = "migrator.source_files_sha256"
"""A sharded source's digests: JSON, each file (relative to its folder) -> sha256."""
SOURCES_HASH_KEY = "migrator.sources_sha256"
"""Several sources' digests: JSON, each source's name -> {file: sha256}."""


def hash_metadata(reader: Reader, path: Path, storage: StorageOptions | None = None) -> dict[str, str]:
    """The `--hash-sources` metadata: one file's sha256 (`migrator.source_sha256`, as before), a
    sharded source's per-file table, or one table per source of a `sources:` recipe."""
    from .metadata import SOURCE_HASH_KEY

    if isinstance(reader, UnionReader):
        return {SOURCES_HASH_KEY: digests_json({p.label: file_digests(p.reader, p.path, storage)
                                                for p in reader.parts})}
    digests = file_digests(reader, path, storage)
    if reader.shards is None:
        return {SOURCE_HASH_KEY: next(iter(digests.values()))}
    return {SOURCE_FILES_HASH_KEY: digests_json(digests)}


def file_digests(reader: Reader, path: Path, storage: StorageOptions | None = None) -> dict[str, str]:
    """sha256 of every file a source reads: the file itself, or each shard and the index of a
    sharded source (keyed by their path relative to its folder)."""
    from ..storage.remote import as_path
    from .metadata import sha256_file

    shards = reader.shards
    if shards is None:
        return {path.name: sha256_file(path, storage)}
    folder = as_path(reader.folder or path.parent)  # a URL stays a URL (Path would drop a '/')
    files = [s.path for s in shards]
    index = reader.index_path
    if index is not None:
        files.insert(0, as_path(index))
    return {os.path.relpath(f, folder): sha256_file(f, storage) for f in files}


def digests_json(digests: Mapping[str, Any]) -> str:
    """A digest table as one metadata value (compact JSON, keys sorted)."""
    return json.dumps(dict(digests), sort_keys=True, separators=(",", ":"))


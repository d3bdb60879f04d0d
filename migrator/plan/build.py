"""Compile a recipe into a lazy plan: per source tensor, name after remaps -> contiguous indices ->
filter -> adapters -> template slot -> dtype policy. No tensor byte is read here.

The plan also holds the report a run would give (applied, skipped, missing, unused, errors), so
`migrate plan` can show it and `migrate run` can refuse to write anything when it has errors.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import dtypes
from ..core.dtypes import DType
from ..core.errors import LimitExceededError, MigratorError, PlanError
from ..core.limits import DEFAULT_LIMITS, Limits
from ..core.scalars import Scalar
from ..core.tensor import LazyTensor
from ..core.version import __version__
from ..files.io import Reader, Writer, open_file, writer_class
from ..formats.registry import has_torch_names, is_format, target_format
from ..naming import (
    KeyRemapper,
    NameFilter,
    NamingError,
    RemapRule,
    contiguous_names,
    find_collisions,
    strip_enum_variant,
)
from ..recipe.model import CastSpec, Recipe
from ..storage.paths import resolve_path
from ..storage.remote import as_path
from ..storage.remote.options import NO_STORAGE_OPTIONS, StorageOptions
from ..transform.modules import in_convert_syntax
from .casts import Casts, apply_cast
from .entry import PlanEntry
from .kept import checkpoint_structure, optimizer_as_weights, target_scalars
from .metadata import (
    RECIPE_HASH_KEY,
    TEMPLATE_HASH_KEY,
    VERSION_KEY,
    loadable_metadata,
    output_metadata,
    sha256_file,
)
from .report import ApplyReport, ReportError

if TYPE_CHECKING:
    from .sources import UnionReader


@dataclass
class Plan:
    source_path: Path
    source_format: str
    target_path: Path
    target_format: str
    template_path: Path | None
    entries: list[PlanEntry]
    report: ApplyReport
    metadata: dict[str, str]
    scalars: dict[str, Scalar]
    overwrite: bool
    fsync: bool = True
    notes: list[str] = field(default_factory=list)
    fatal: list[str] = field(default_factory=list)  # problems that stop a run before writing
    readers: list[Reader] = field(default_factory=list, repr=False)
    writer: Writer | None = field(default=None, repr=False)  # planned and checked; None when fatal
    inputs: list[tuple[str, Path]] = field(default_factory=list)  # (label, path) per source read
    # the run's other inputs (the recipe, the model config it reads): no output may replace them
    read_also: list[Path] = field(default_factory=list)
    structure_notes: list[str] = field(default_factory=list)  # a PyTorch checkpoint's structure: what was kept
    # the recipe's storage_options, per URL: what reads, checks and writes the plan's URLs is given them
    storage: StorageOptions | None = None
    # Burn's OptimizerRecord of a PyTorch training checkpoint (training_state: keep), published with the model
    record: Writer | None = field(default=None, repr=False)
    record_path: Path | None = None
    scheduler: Writer | None = field(default=None, repr=False)  # Burn's LrSchedulerRecord, with the record
    scheduler_path: Path | None = None

    @property
    def union(self) -> UnionReader | None:
        """The joined reader of a recipe with `sources:` (it knows each tensor's source), else None."""
        from .sources import UnionReader

        first = self.readers[0] if self.readers else None
        return first if isinstance(first, UnionReader) else None

    @property
    def ok(self) -> bool:
        return not self.fatal

    def file_readers(self) -> list[Reader]:
        """The plan's readers, each source of a `sources:` recipe on its own."""
        return [f for r in self.readers for f in r.file_readers()]

    def source_modes(self) -> list[int]:
        """The permission bits of the files the plan reads: a new output gets no more than they share."""
        return [r.source.mode for r in self.file_readers() if r.source.mode is not None]

    def close(self) -> None:
        for r in self.readers:
            r.close()

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _enum_free(name: str) -> str:
    """The name with every enum-variant-looking segment removed: Burn strips the variants its live
    module has; a file has no module, so every inner CamelCase segment counts."""
    while (stripped := strip_enum_variant(name)) is not None:
        name = stripped
    return name


def build_plan(recipe: Recipe, base_dir: Path, *, recipe_sha256: str | None = None, hash_sources: bool = False,
               overwrite: bool | None = None, fsync: bool | None = None,
               module_origins: Mapping[tuple[str, int], str] | None = None,
               source_origins: Mapping[int, str] | None = None,
               op_origins: Mapping[tuple[int, str], tuple[str, int, int]] | None = None,
               limits: Limits = DEFAULT_LIMITS, hint_syntax: str = "recipe") -> Plan:
    """Open the files (headers only) and compile the recipe; the returned plan owns the open readers.
    `hint_syntax` ("recipe" or "convert"): how a hint spells what to add (`modules:` or `--modules`).

    `module_origins` (`LoadedRecipe.module_origins`) lets a module-type error name its recipe line;
    `op_origins` (`LoadedRecipe.op_origins`) does the same for an op's error, `source_origins`
    (`LoadedRecipe.source_origins`) for a `sources:` entry's. `limits` bounds what the source and
    template files may make their readers allocate."""
    if recipe.unresolved_references:  # placeholders stand for them: never plan with those
        from ..recipe.issues import RecipeError

        raise RecipeError(recipe.unresolved_references)
    src_path = resolve_path(base_dir, recipe.inputs()[0].path)
    tgt_path = resolve_path(base_dir, recipe.target.path)
    tpl_path = resolve_path(base_dir, recipe.target.template) if recipe.target.template else None
    storage = storage_of(recipe, base_dir)
    out_fmt = output_format(recipe, tgt_path)
    if recipe.target.shard is None:
        tgt_path = as_path(writer_class(out_fmt).resolve_path(tgt_path))
    from .sources import open_source, open_sources

    if recipe.target.optimizer is not None and not (is_format(out_fmt, for_burn=True)
                                                    and recipe.training_state == "keep"
                                                    and recipe.target.shard is None and tpl_path is None):
        # only a one-file burnpack target kept with its training state writes Burn's record: elsewhere the
        # path would be silently ignored (a target of another format keeps the optimizer in its own way)
        raise PlanError("target.optimizer (--optimizer-out) is where Burn's optimizer record goes: it needs a .bpk "
                        f"target with training_state: keep, without shard or template (this target is {out_fmt}"
                        f"{'' if recipe.training_state == 'keep' else ', training_state not keep'})",
                        file=str(tgt_path))
    model_key: str | None = None  # training_state: keep under source.top_level_key
    if recipe.sources is not None:
        reader: Reader = open_sources(recipe, base_dir, source_origins, limits=limits, storage=storage,
                                      for_burn=recipe.for_burn(out_fmt))
        inputs = [(p.label, p.path) for p in reader.parts]  # type: ignore[attr-defined]
    else:
        one_file = is_format(out_fmt, keeps_structure=True) and recipe.target.shard is None and tpl_path is None
        # a PyTorch training checkpoint into Burn keeps its optimizer only when asked (`training_state: keep`)
        burn_keep = (is_format(out_fmt, for_burn=True) and recipe.training_state == "keep"
                     and recipe.target.shard is None and tpl_path is None)
        spec = recipe.inputs()[0]
        from .trainer_target import is_trainer_target

        if is_trainer_target(recipe, src_path, tpl_path):  # a Trainer folder: the recipe applies under `model`
            if spec.top_level_key not in (None, "model"):
                raise PlanError(f"source.top_level_key '{spec.top_level_key}': a Trainer folder target takes the "
                                "source's model ('model') and its optimizer", file=str(src_path))
            burn_keep, model_key = True, "model"
            spec = spec.model_copy(update={"top_level_key": None})
        elif (one_file or burn_keep) and recipe.training_state == "keep" and spec.top_level_key:
            # the whole checkpoint is the target: opened whole, the recipe applied under the key
            key = spec.top_level_key
            model_key = key if isinstance(key, str) else ".".join(key)
            spec = spec.model_copy(update={"top_level_key": None})
        reader = open_source(spec, src_path, limits=limits, keep_structure=one_file or burn_keep, base_dir=base_dir,
                             storage=storage, training_state=recipe.training_state)
        inputs = [(str(src_path), src_path)]
    readers: list[Reader] = [reader]
    try:
        from ..files.sharded_writer import copy_folder

        copy_from = None if recipe.target.copy_from is None else copy_folder(
            resolve_path(base_dir, recipe.target.copy_from), tgt_path)
        plan = _compile(recipe, reader, src_path, tgt_path, out_fmt, tpl_path, readers,
                        head_dim=_head_dim(recipe, base_dir), copy_from=copy_from, hint_syntax=hint_syntax,
                        recipe_sha256=recipe_sha256, hash_sources=hash_sources, module_origins=module_origins,
                        op_origins=op_origins, overwrite=recipe.target.overwrite if overwrite is None else overwrite,
                        fsync=recipe.target.fsync if fsync is None else fsync, limits=limits, storage=storage,
                        model_key=model_key, record_path=None if recipe.target.optimizer is None else resolve_path(
                            base_dir, recipe.target.optimizer), order_path=None if recipe.target.param_order is None
                        else resolve_path(base_dir, recipe.target.param_order))
        plan.inputs = inputs
        return plan
    except BaseException:
        for r in readers:
            r.close()
        raise


def _head_dim(recipe: Recipe, base_dir: Path) -> tuple[int, str, str] | None:
    """The head size the model's config declares, for a recipe with `rope_permute` ops to be checked
    against (`recipe.config`); None without such ops or a config that says."""
    from ..recipe.config import ConfigError, find_config, head_dim_of, load_config
    from ..recipe.ops import op_kind_and_spec

    if not any(op_kind_and_spec(op)[0] == "rope_permute" for op in recipe.ops):
        return None
    path = find_config(recipe.config, recipe.inputs()[0].path, base_dir)
    if path is None:
        return None
    try:
        found = head_dim_of(load_config(path))
    except ConfigError as e:
        raise PlanError(str(e), file=str(path)) from None
    return None if found is None else (found[0], found[1], os.path.normpath(path))


def output_format(recipe: Recipe, tgt_path: Path) -> str:
    """The format the recipe writes: a folder of shards in the format named, else the shards' suffix,
    else SafeTensors; a file in the format named, else by its extension."""
    return target_format(tgt_path, recipe.target.format, sharded=recipe.target.shard is not None)


def storage_of(recipe: Recipe, base_dir: Path) -> StorageOptions:
    """The recipe's `storage_options:` per URL (its sources', its target's, its template's), refused
    when one holds a credential; a local path's are ignored."""
    storage = NO_STORAGE_OPTIONS
    for spec in recipe.inputs():
        storage = storage.adding(resolve_path(base_dir, spec.path), spec.storage_options)
    storage = storage.adding(resolve_path(base_dir, recipe.target.path), recipe.target.storage_options)
    if recipe.target.template:
        storage = storage.adding(resolve_path(base_dir, recipe.target.template),
                                 recipe.target.template_storage_options or recipe.target.storage_options)
    return storage


def renumbers_by_default(recipe: Recipe, base_dir: Path, limits: Limits = DEFAULT_LIMITS) -> bool:
    """Whether a one-source recipe that leaves `contiguous_indices` unset renumbers its source's
    names: a PyTorch source whose output is for Burn. Opens the source's header to know its format;
    `--emit-recipe` uses it to write the setting out."""
    if recipe.source is None or recipe.source.contiguous_indices is not None:
        return False
    if not recipe.for_burn(output_format(recipe, resolve_path(base_dir, recipe.target.path))):
        return False
    from .sources import open_source

    with open_source(recipe.source, resolve_path(base_dir, recipe.source.path), limits=limits,
                     base_dir=base_dir, storage=storage_of(recipe, base_dir)) as reader:
        return has_torch_names(reader)


@dataclass
class _Declarations:
    """Adapter errors that one module declaration each would fix ((type, module path, what it does)),
    and every module path of the plan, so that one hint covers them all (`modules.declaration_hint`)."""

    wanted: list[tuple[str, str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


_Item = tuple[LazyTensor, LazyTensor, tuple[str, ...], Any]
"""A kept source tensor after renames and adapters: (source, result, ops, module)."""


def _compile(recipe: Recipe, reader: Reader, src_path: Path, tgt_path: Path, out_fmt: str, tpl_path: Path | None,
             readers: list[Reader], *, recipe_sha256: str | None, hash_sources: bool, overwrite: bool,
             head_dim: tuple[int, str, str] | None = None, copy_from: Path | None = None,
             hint_syntax: str = "recipe",
             fsync: bool, module_origins: Mapping[tuple[str, int], str] | None = None,
             op_origins: Mapping[tuple[int, str], tuple[str, int, int]] | None = None,
             limits: Limits = DEFAULT_LIMITS, storage: StorageOptions | None = None,
             model_key: str | None = None, record_path: Path | None = None,
             order_path: Path | None = None) -> Plan:
    fatal: list[str] = []
    # steps 1-4 in their own frame: their per-tensor intermediates are gone before the writer is planned
    declares = _Declarations()  # modules one declaration each would fix
    from .training_state import training_state

    training = training_state(recipe, reader, out_fmt, tpl_path, fatal, model_key)
    entries, report = _plan_tensors(recipe, reader, tpl_path, readers, fatal, module_origins, op_origins, limits,
                                    for_burn=recipe.for_burn(out_fmt), head_dim=head_dim, declares=declares,
                                    storage=storage, tensors=training.model)
    if training.optimizers:
        def replan(tensors: list[LazyTensor]) -> list[PlanEntry]:  # the same steps over moments
            return _plan_tensors(recipe, reader, None, readers, [], module_origins, op_origins, limits,
                                 for_burn=recipe.for_burn(out_fmt), head_dim=head_dim, storage=storage,
                                 tensors=tensors, cast=False)[0]

        from .optimizer_order import new_model_order

        order = new_model_order(order_path, training, fatal, limits, storage)
        entries += training.follow(reader, entries, replan, fatal, order)
        if is_format(reader.format, trainer_folder=True) and not training.burn:  # optimizer.pt: the Trainer's order
            from .trainer_target import in_trainer_order

            entries = in_trainer_order(training, reader, entries, fatal, copy_from, recipe.target.copies())
    elif order_path is not None:
        fatal.append("target.param_order orders a kept optimizer's ids: it needs training_state: keep, a .pt target "
                     "and a source with an optimizer")
    report.optimizer = training.fates
    entries = training.placed(entries)
    record = pair = None
    if training.burn:  # the model's tensors get param_ids; the optimizers' state becomes Burn's record
        from .burn_optimizer import default_record_path
        from .burn_pair import paired_record

        burnpack = writer_class("burnpack")
        entries, record, pair = paired_record(training, entries, reader, fatal, burnpack.resolve_path(tgt_path),
                                              burnpack.resolve_path(record_path or default_record_path(tgt_path)))
    for e in report.errors:
        if e.kind != "shape_mismatch" or recipe.validate_shapes:
            fatal.append(str(e) if hint_syntax != "convert" else in_convert_syntax(str(e)))
    if declares.wanted:
        from ..transform.modules import declaration_hint

        fatal.append(declaration_hint(declares.wanted, declares.paths, hint_syntax))

    # 5. metadata, scalars, and whether the target format can hold the result
    meta = output_metadata(reader.format, out_fmt, reader.metadata, extra=recipe.target.metadata,
                           clear=recipe.target.clear_metadata)
    notes: list[str] = list(reader.notes)  # what a source did on its own (a LoRA fold)
    notes += training.notes
    if not training.trainer:  # a Trainer folder target writes the optimizer's state into its optimizer.pt
        optimizer_as_weights([e.target for e in entries], out_fmt, folder=recipe.target.shard is not None,
                             hint_syntax=hint_syntax, notes=notes, fatal=fatal)
    if is_format(out_fmt, metadata="text") and not recipe.target.clear_metadata:
        if recipe_sha256:
            meta[RECIPE_HASH_KEY] = recipe_sha256
            meta[VERSION_KEY] = __version__
        if hash_sources:
            from .sources import hash_metadata

            meta.update(hash_metadata(reader, src_path, storage))
            if tpl_path is not None:
                meta[TEMPLATE_HASH_KEY] = sha256_file(tpl_path, storage)
        loadable_metadata(meta, out_fmt)  # the provenance keys alone must not make it unloadable
    if report.renumbered:
        shown = ", ".join(f"{old} -> {new}" for old, new in report.renumbered[:5])
        more = f" and {len(report.renumbered) - 5} more" if len(report.renumbered) > 5 else ""
        notes.append(f"renumbered {len(report.renumbered)} names to contiguous indices (contiguous_indices; "
                     f"Burn's Vec<Module> has no gaps): {shown}{more}")
    kept: list[str] = []  # what keeping a checkpoint's structure says
    problems = len(fatal)
    structure = checkpoint_structure(recipe, reader, out_fmt, tpl_path,
                                     ((e.source, e.target) for e in entries if e.optimizer is None), kept, fatal,
                                     swap=training.swap)
    notes += kept
    flat = structure is None and len(fatal) == problems  # else the scalars are in the structure (or refused)
    scalars = target_scalars(recipe, reader, out_fmt, notes if flat else [], fatal)
    if training.burn:  # torch's parameter ids and names mean nothing beside a Burn model
        from .burn_optimizer import without_torch_ids

        if recipe.target.scalars == "keep":
            scalars = without_torch_ids(scalars, training)
        meta = {**without_torch_ids(meta, training), **recipe.target.metadata}
        if pair is not None:  # the stamp both files of the pair carry (plan/burn_pair.py)
            meta.update(pair.model_meta)
    plan = Plan(src_path, reader.format, tgt_path, out_fmt, tpl_path, entries, report, meta, scalars, overwrite, fsync,
                notes, fatal, readers, structure_notes=kept, storage=storage)
    if not fatal:
        try:
            if training.trainer:  # the model's files, optimizer.pt and the Trainer's other files
                from ..files.sharded_writer import default_weights_name
                from .trainer_target import trainer_writer

                assert recipe.target.shard is not None
                plan.writer = trainer_writer(
                    training, entries, reader, out_fmt, scalars=scalars, max_size=recipe.target.shard.max_size,
                    copies=recipe.target.copies(), copy_from=copy_from or reader.folder,
                    weights_name=recipe.target.shard.name or default_weights_name(out_fmt, reader.folder),
                    storage=storage, **_writer_options(recipe, out_fmt, meta, reader, src_path, notes,
                                                       folder_target=True))
                plan.notes += plan.writer.notes
            elif recipe.target.shard is not None:
                from ..files.sharded_writer import ShardedWriter, default_weights_name

                folder = reader.folder or src_path.parent
                if copy_from is not None:
                    folder = copy_from
                name = recipe.target.shard.name or default_weights_name(out_fmt, reader.folder)
                made = _made_files(recipe, reader, [e.tensor.name for e in entries], notes)  # a GGUF's config.json
                options = _writer_options(recipe, out_fmt, meta, reader, src_path, notes, folder_target=True)
                made_tensors = options.pop("made_tensors", [])  # a GGUF's rope_freqs.weight
                plan.writer = ShardedWriter(out_fmt, [e.tensor for e in entries] + made_tensors, scalars=scalars,
                                            max_size=recipe.target.shard.max_size, copies=recipe.target.copies(),
                                            copy_from=folder, weights_name=name,
                                            config_update=reader.config_update,
                                            generated=[*reader.generated, *made.items()], storage=storage, **options)
                plan.notes += plan.writer.notes
            else:
                if recipe.target.hf_config:
                    raise PlanError("target.hf_config writes a config.json into a folder target (end the path with "
                                    "'/')")
                tree: dict[str, Any] = {} if structure is None else {"structure": structure}
                options = _writer_options(recipe, out_fmt, meta, reader, src_path, notes)
                made_tensors = options.pop("made_tensors", [])  # a GGUF's rope_freqs.weight
                plan.writer = writer_class(out_fmt)([e.tensor for e in entries] + made_tensors, scalars=scalars,
                                                    **options, **tree)
                notes += plan.writer.notes  # e.g. a GGUF tensor written F16, not quantized
            if record is not None and pair is not None:
                from ..formats.burnpack import BurnpackWriter

                # Burn's record: its paths, and the pair's stamp (no format/producer keys; Burn's
                # load_record keeps only the keys that parse as a ParamId)
                plan.record = BurnpackWriter(record.tensors, metadata={**record.paths, **pair.record_meta},
                                             scalars=record.scalars)
                plan.record_path = Path(pair.record_file)
                notes.append(f"Burn's optimizer record: {plan.record.resolve_path(plan.record_path)}, written with "
                             "the model (ModuleOptimizer::load reads it; target.optimizer or --optimizer-out choose "
                             "its path)")
                from .burn_scheduler import default_scheduler_path, scheduler_record

                lr = scheduler_record(reader.structure)
                notes += lr.notes
                if lr.scalars:  # LrSchedulerRecord::load reads it (the Learner's ModuleLrScheduler)
                    plan.scheduler = BurnpackWriter([], metadata={}, scalars=lr.scalars)
                    plan.scheduler_path = default_scheduler_path(tgt_path)
                    notes.append(f"Burn's LR scheduler record: {plan.scheduler_path}, written with them")
        except MigratorError as e:
            fatal.append(str(e))
    return plan


def _made_files(recipe: Recipe, reader: Reader, names: list[str], notes: list[str]) -> dict[str, bytes]:
    """Companion files a sharded target is given from the plan: a config.json made from a GGUF's key/values,
    and the tokenizer files of its vocabulary where they can be written (a tokenizer.json for byte-level BPE, a
    tokenizer.model for SentencePiece)."""
    if not recipe.target.hf_config:
        return {}
    import json

    from ..formats.gguf.bpe import hf_tokenizer_files
    from ..formats.gguf.llama import ROPE_FREQS, hf_config

    scaling = recipe.target.rope_scaling
    given = {"rope_scaling": scaling.model_dump()} if scaling is not None else None
    rope_freqs = reader[ROPE_FREQS].numpy() if ROPE_FREQS in reader else None
    config = hf_config(reader.metadata, names, rope_freqs=rope_freqs, given=given)
    made = {"config.json": (json.dumps(config, indent=2) + "\n").encode()}
    if getattr(reader.metadata.get("tokenizer.ggml.model"), "data", None) == "llama":  # SentencePiece
        from ..formats.gguf.spm import sentencepiece_files

        tokenizer, said = sentencepiece_files(reader.metadata)
    else:
        tokenizer, said = hf_tokenizer_files(reader.metadata)
    notes += said
    return {**made, **tokenizer}


def _writer_options(recipe: Recipe, out_fmt: str, meta: dict[str, str], reader: Reader,
                    src_path: Path, notes: list[str], *, folder_target: bool = False) -> dict[str, Any]:
    """The writer's metadata, and options only one format's writer takes: a GGUF target's per-tensor
    quantization rules, its key/values with a tokenizer's (target.tokenizer, relative to the
    source's folder), and the tensors it is given (`made_tensors`: rope_freqs.weight). A folder
    target's rope_scaling with hf_config is its config.json's (`_made_files`)."""
    target = recipe.target
    rope_tensor = target.rope_scaling is not None and not (folder_target and target.hf_config)
    if (target.quantize or target.tokenizer or rope_tensor) and not is_format(out_fmt, llama_cpp=True):
        raise PlanError("target.quantize, target.tokenizer and target.rope_scaling apply to GGUF targets; this target "
                        f"is {out_fmt}")
    if not is_format(out_fmt, llama_cpp=True):
        return {"metadata": meta}
    made_tensors = []
    if target.rope_scaling is not None and rope_tensor:
        import json

        from ..formats.gguf.llama import ROPE_SCALING_KEY, rope_freqs_tensor

        scaling = target.rope_scaling.model_dump()
        made_tensors.append(rope_freqs_tensor(scaling, meta))
        meta = {**meta, ROPE_SCALING_KEY: json.dumps(scaling)}
        notes.append(f"{made_tensors[0].name}: {made_tensors[0].shape[0]} RoPE factors computed from "
                     f"target.rope_scaling (llama3, factor {scaling['factor']}), as llama.cpp's converter writes them")
    if target.tokenizer:
        from ..formats.gguf.tokenizer import tokenizer_key_values

        folder = Path(reader.folder or src_path.parent)
        tokenizer, said = tokenizer_key_values(folder / target.tokenizer)
        notes += said
        given = {k: v for k, v in meta.items() if k in target.metadata}  # the recipe's own word wins (e.g. .pre)
        meta = {**meta, **tokenizer, **given}
    return {"quantize": target.quantize, "metadata": meta, "made_tensors": made_tensors}


def check_name_lengths(names: Iterable[str], limits: Limits, file: str) -> None:
    """Refuse a name longer than `limits.max_name_chars` (when set: 0, the default, is no cap) before
    any pattern sees it. Patterns run on RE2 in time linear in the name, so no cap is needed for speed."""
    most = limits.max_name_chars
    if not most:
        return
    for name in names:
        if len(name) > most:
            raise LimitExceededError(f"tensor name of {len(name):,} characters ('{name[:60]}...'): names longer than "
                                     f"{most} characters are not matched against patterns (max_name_chars)", file=file)


def _plan_tensors(recipe: Recipe, reader: Reader, tpl_path: Path | None, readers: list[Reader],
                  fatal: list[str], module_origins: Mapping[tuple[str, int], str] | None = None,
                  op_origins: Mapping[tuple[int, str], tuple[str, int, int]] | None = None,
                  limits: Limits = DEFAULT_LIMITS, *, for_burn: bool = False,
                  storage: StorageOptions | None = None,
                  head_dim: tuple[int, str, str] | None = None,
                  declares: _Declarations | None = None, tensors: list[LazyTensor] | None = None,
                  cast: bool = True) -> tuple[list[PlanEntry], ApplyReport]:
    """Steps 1-4: the plan's entries and report; problems that stop a run are added to `fatal`.
    `for_burn`: the output is for Burn (`Recipe.for_burn`), so a PyTorch source is renumbered by default.
    `tensors`: these instead of the reader's (a training checkpoint's model, or its optimizer moments in
    their parameters' places); `cast`: whether the dtype policy applies (moments keep their dtype)."""
    is_pytorch = has_torch_names(reader)
    tensors = reader.tensors if tensors is None else tensors
    names = [t.name for t in tensors]
    check_name_lengths(names, limits, reader.label)
    renumbered: list[tuple[str, str]] = []
    current, ops = _renamed(recipe, names, is_pytorch and for_burn, reader.label, reader.describe,
                            renumbered)

    # 2. filter, on the renamed names (names and `current` run in parallel: no name -> name dict)
    include = NameFilter(recipe.filter.include) if recipe.filter.include is not None else None
    exclude = NameFilter(recipe.filter.exclude) if recipe.filter.exclude else None
    kept: list[LazyTensor] = tensors
    kept_names: list[str] = current
    skipped: list[str] = []
    skipped_from: list[str] = []  # the source tensor of each skipped name
    if include is not None or exclude is not None:
        kept, kept_names = [], []
        for t, new in zip(tensors, current, strict=True):
            if (include is not None and not include(new)) or (exclude is not None and exclude(new)):
                skipped.append(new)
                skipped_from.append(t.name)
            else:
                kept.append(t)
                kept_names.append(new)

    # 2b. ops (migrator.transform.ops): their outputs replace their inputs, which no later step sees
    made: dict[int, tuple[LazyTensor, tuple[str, ...]]] | None = None
    op_nodes: list[dict[str, Any]] = []
    shapes_of: list[tuple[str, tuple[int, ...]]] | None = None
    if recipe.ops:
        from ..transform.ops import apply_ops

        done = apply_ops(recipe.ops, kept, kept_names, ops, op_origins, head_dim=head_dim)
        kept, kept_names, made = done.tensors, done.names, done.made
        op_nodes = [n.to_json() for n in done.nodes]
        shapes_of = list(zip(kept_names, [t.shape for t in kept], strict=True))  # module types see the outputs

    # 3. adapters, with module types resolved from declarations and the source's own names
    errors: list[ReportError] = []
    adapter = resolver = None
    if recipe.adapters:
        from ..transform.adapters import build_adapter
        from ..transform.modules import ModuleResolver

        adapter = build_adapter(recipe.adapters)
        resolver = ModuleResolver(recipe.modules, shapes_of if shapes_of is not None else
                                  list(zip(current, [t.shape for t in tensors], strict=True)), module_origins,
                                  reader.format)
    del names, current
    items = _adapted(kept, kept_names, ops, adapter, resolver, errors, made, declares)

    # 4. template slots, or the source order when there is no template
    cast_to = dtypes.parse(recipe.dtype.cast) if isinstance(recipe.dtype, CastSpec) and cast else None
    missing: list[tuple[str, str]] = []
    unused: list[str] = []
    if tpl_path is not None:
        by_name = _by_name(items, fatal)  # a template looks sources up by name
        entries, applied, missing, unused = _fill_template(recipe, tpl_path, readers, is_pytorch, by_name, adapter,
                                                           resolver, cast_to, errors, fatal, limits, storage)
        unused_from = [by_name[n][0].name for n in unused]
        sources = [e.source for e in entries if e.source is not None and not e.kept_from_template]
    else:
        resolver = None  # the generator holds it only while it runs: 100k modules' params are freed with it
        entries, applied = _in_source_order(items, cast_to)
        sources = [e.source for e in entries]  # type: ignore[misc]  # every entry has a source here
        if len(set(applied)) != len(applied):  # only to name the clash
            _by_name(((e.source_tensor, e.tensor, e.ops, e.module) for e in entries), fatal)  # type: ignore[misc]
        if recipe.dtype == "template":
            fatal.append("dtype: template needs target.template")
    from .sources import UnionReader, add_provenance

    if isinstance(reader, UnionReader):  # several sources: each renumbered its own names
        renumbered = reader.renumbered
    report = ApplyReport(applied=applied, skipped=sorted(skipped), missing=sorted(missing), unused=unused,
                         errors=errors, sources=sources, ops=op_nodes, renumbered=renumbered)
    if declares is not None and declares.wanted:  # the hint's patterns must not match other modules
        from ..transform.modules import module_path

        declares.paths = list(dict.fromkeys(module_path(n) for n in kept_names))
    if isinstance(reader, UnionReader):  # several sources: say which one each tensor came from
        add_provenance(report, reader, list(zip(skipped, skipped_from, strict=True)),
                       list(zip(unused, unused_from, strict=True)) if tpl_path is not None else [])
    return entries, report


def _renamed(recipe: Recipe, names: list[str], renumber_default: bool, label: str,
             describe: Callable[[str], str] = repr, renumbered: list[tuple[str, str]] | None = None
             ) -> tuple[list[str], dict[str, list[str]]]:
    """Step 1, names: remaps, then contiguous indices (`renumber_default` when the recipe does not
    say: a PyTorch source whose output is for Burn). Returns the new names (`names` itself when none
    changes) and the ops of the renamed tensors only; each renumbering (name before -> after) is
    appended to `renumbered`. `describe` shows a source name in an error (with several sources:
    which one it is from)."""
    ops: dict[str, list[str]] = {}  # only for renamed tensors: most names pass unchanged
    remapper = KeyRemapper([RemapRule(r.from_, r.to, r.syntax) for r in recipe.remap]) if recipe.remap else None
    current = names
    if remapper is not None:
        try:
            current = list(map(remapper.remap_name, names))
        except NamingError as e:  # validated already; kept for safety
            raise PlanError(f"remap: {e}") from None
        ops = {orig: [f"remap {orig} -> {new}"] for orig, new in zip(names, current, strict=True) if new != orig}
    # several sources: each entry renumbered its own indices already
    contiguous = recipe.source.contiguous_indices if recipe.source is not None else False
    if contiguous is None:
        contiguous = renumber_default
    if contiguous:
        mapped = contiguous_names(current)
        if mapped is not current:
            for orig, before, new in zip(names, current, mapped, strict=True):
                if new is not before and new != before:  # unchanged names come back as the same object
                    ops.setdefault(orig, []).append(f"index {before} -> {new}")
                    if renumbered is not None:
                        renumbered.append((before, new))
        current = mapped
    # a set is enough to know there is no collision; find_collisions only names them
    collisions = find_collisions(zip(current, names, strict=True)) if len(set(current)) != len(current) else None
    if collisions:
        lines = [f"'{new}' <- {', '.join(describe(o) for o in origs)}" for new, origs in sorted(collisions.items())]
        raise PlanError("several source tensors map to the same name after remap/indices: " + "; ".join(lines),
                        file=label)
    return current, ops


def _adapted(kept: list[LazyTensor], kept_names: list[str], ops: dict[str, list[str]], adapter: Any, resolver: Any,
             errors: list[ReportError], made: dict[int, tuple[LazyTensor, Any]] | None = None,
             declares: _Declarations | None = None) -> Iterator[_Item]:
    """Each kept tensor renamed, then adapted; a tensor whose adapter fails is reported in `errors` and
    left out. Lazy, so a plan without a template never holds these tuples for all tensors at once.
    `made`: op outputs (by id) -> the source tensor the report names and their ops so far."""
    if adapter is None or resolver is None:
        for t, new in zip(kept, kept_names, strict=True):
            pre = ops.get(t.name) if ops else None
            src = t
            if made and id(t) in made:
                src, pre = made[id(t)]
            yield src, t if new is t.name or new == t.name else t.renamed(new), () if pre is None else tuple(pre), None
        return
    resolve, adapt = resolver.resolve, adapter.adapt
    for t, new in zip(kept, kept_names, strict=True):
        base = t if new is t.name or new == t.name else t.renamed(new)
        pre = ops.get(t.name) if ops else None
        src = t
        if made and id(t) in made:
            src, pre = made[id(t)]
        try:
            module = resolve(new)
            result = adapt(base, module)
        except MigratorError as e:
            errors.append(ReportError.adapter_error(new, e.detail, source=src.name))
            if declares is not None and getattr(e, "declare", None) is not None:
                declares.wanted.append(e.declare)  # type: ignore[attr-defined]
            continue
        yield src, result.tensor, result.ops if pre is None else (*pre, *result.ops), module


def _by_name(items: Iterable[_Item], fatal: list[str]) -> dict[str, _Item]:
    """Results by name; two results with one name are fatal (the later one is kept)."""
    by_name: dict[str, _Item] = {}
    for item in items:
        name = item[1].name
        if name in by_name:
            fatal.append(f"adapters map '{by_name[name][0].name}' and '{item[0].name}' onto the same name "
                         f"'{name}'")
        by_name[name] = item
    return by_name


def _in_source_order(items: Iterator[_Item], cast_to: DType | None) -> tuple[list[PlanEntry], list[str]]:
    """An entry per adapted tensor, cast by the dtype policy, and the names applied."""
    entries: list[PlanEntry] = []
    applied: list[str] = []
    append_entry, append_applied = entries.append, applied.append
    cast = Casts(cast_to)
    joined: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, ...]] = {}  # few distinct op lists
    for src, result, t_ops, module in items:
        tensor, more = cast(result)
        name = result.name
        if more and t_ops:  # e.g. transpose + cast: one shared tuple per distinct pair, not one per tensor
            all_ops = joined.get((t_ops, more))
            if all_ops is None:
                all_ops = t_ops + more
                if len(joined) < 4096:
                    joined[(t_ops, more)] = all_ops
        else:
            all_ops = more or t_ops
        append_entry(PlanEntry(name, src.name, tensor, src, all_ops, module))
        append_applied(name)
    return entries, applied


def _fill_template(recipe: Recipe, tpl_path: Path, readers: list[Reader], is_pytorch: bool,
                   by_name: dict[str, _Item], adapter: Any, resolver: Any, cast_to: DType | None,
                   errors: list[ReportError], fatal: list[str], limits: Limits = DEFAULT_LIMITS,
                   storage: StorageOptions | None = None
                   ) -> tuple[list[PlanEntry], list[str], list[tuple[str, str]], list[str]]:
    """An entry per template slot: entries, applied, missing and unused names."""
    entries: list[PlanEntry] = []
    missing: list[tuple[str, str]] = []
    applied: list[str] = []
    template = open_file(tpl_path, recipe.target.template_format, limits=limits, storage=storage)
    readers.append(template)
    if recipe.source is None:
        from .sources import skip_enum_variants

        skip_enum = skip_enum_variants(recipe, is_pytorch)
    else:
        chosen = recipe.source.skip_enum_variants
        skip_enum = is_pytorch if chosen is None else chosen
    enum_free = {_enum_free(n): n for n in by_name} if skip_enum else {}

    def lookup(name: str) -> str | None:
        key = name if name in by_name else None
        if key is None and skip_enum:
            key = enum_free.get(_enum_free(name))
        if key is None and adapter is not None:
            key = _alternative(adapter, resolver, name, by_name)
        return key

    from ..transform.template_match import AmbiguousMatch, match_slots

    check_name_lengths([t.name for t in template.tensors], limits, template.label)
    try:  # by name, or by position where the template's indices have gaps (see template_match)
        keys = match_slots([t.name for t in template.tensors], lookup)
    except AmbiguousMatch as e:
        fatal.append(str(e))
        keys = [None] * len(template.tensors)
    used: set[str] = set()
    for slot, key in zip(template.tensors, keys, strict=True):
        if key is None or key in used:
            missing.append((slot.name, ""))
            entries.append(PlanEntry(slot.name, None, slot, None, ("template value kept",), None, True))
            continue
        used.add(key)
        src, result, t_ops, module = by_name[key]
        entry = _fit_to_slot(slot, src, result, t_ops, module, recipe, cast_to, errors)
        entries.append(entry)
        if not entry.kept_from_template:
            applied.append(slot.name)
    unused = sorted(n for n in by_name if n not in used)
    if missing and not recipe.allow_partial:
        fatal.append(f"{len(missing)} template tensors have no source (set allow_partial to keep the template's "
                     "values)")
    return entries, applied, missing, unused


def _alternative(adapter: Any, resolver: Any, slot_name: str,
                 by_name: dict[str, tuple[LazyTensor, LazyTensor, tuple[str, ...], Any]]) -> str | None:
    """Burn's alternative-name lookup: the template's `norm.gamma` may be the source's `norm.weight`."""
    if resolver is None:
        return None
    module_path, _, param = slot_name.rpartition(".")
    try:
        module = resolver.resolve(slot_name)
    except MigratorError:  # a conflicting declaration: reported where the source tensor is adapted
        return None
    if module.name is None:
        return None
    alt = adapter.alternative_name(param, module)
    if alt is None:
        return None
    key = f"{module_path}.{alt}" if module_path else alt
    return key if key in by_name else None


def _fit_to_slot(slot: LazyTensor, src: LazyTensor, result: LazyTensor, ops: tuple[str, ...], module: Any,
                 recipe: Recipe, cast_to: DType | None, errors: list[ReportError]) -> PlanEntry:
    """Put a source tensor into a template slot: shape check, dtype policy, param_id, name."""
    if result.shape != slot.shape:
        errors.append(ReportError.shape_mismatch(slot.name, slot.shape, result.shape, source=src.name,
                                                 hint=_shape_hint(result, slot.shape, ops, recipe)))
        return PlanEntry(slot.name, src.name, slot, src, (*ops, "shape mismatch: template value kept"), module, True)
    tensor, more = apply_cast(result, cast_to)
    if recipe.dtype == "template" and tensor.dtype != slot.dtype:
        if tensor.dtype.is_float and slot.dtype.is_float:
            tensor, more = apply_cast(tensor, slot.dtype)
        else:
            errors.append(ReportError.dtype_mismatch(slot.name, slot.dtype.display, tensor.dtype.display,
                                                     source=src.name))
            return PlanEntry(slot.name, src.name, slot, src, ops, module, True)
    param_id = src.param_id if src.param_id is not None else slot.param_id
    final = replace(tensor, name=slot.name, param_id=param_id)
    return PlanEntry(slot.name, src.name, final, src, (*ops, *more), module)


def _shape_hint(result: LazyTensor, expected: tuple[int, ...], ops: tuple[str, ...], recipe: Recipe) -> str | None:
    """What likely fixes a 2-D weight that arrives transposed (the one mismatch with a usual cause)."""
    found = result.shape
    if len(found) != 2 or found[::-1] != tuple(expected):
        return None
    from ..transform.modules import GPT2_CONV1D, exact_regex, module_path, yaml_quoted

    path = module_path(result.name)
    entry = "modules: {%s: [" + yaml_quoted(exact_regex(path)) + "]}"
    if GPT2_CONV1D.match(path.rpartition(".")[2]):
        return (f"GPT-2's Conv1D is stored [in, out], already Burn's Linear layout: declare {entry % 'Conv1D'} "
                "(kept as stored)")
    if any(op.startswith("transpose") for op in ops):
        return "an adapter transposed it as a Linear's weight; if it is none, declare its module's type in modules:"
    layout = [a for a in recipe.adapters if a in ("pytorch_to_burn", "burn_to_pytorch")]
    if layout:
        return f"{layout[0]} transposes only Linear weights: declare it a Linear, {entry % 'Linear'}"
    return "the shape is transposed: add pytorch_to_burn to adapters: (burn_to_pytorch from a Burn file)"

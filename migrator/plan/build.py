"""Compile a recipe into a lazy plan: per source tensor, name after remaps -> contiguous indices ->
filter -> ops -> adapters -> template slot -> dtype policy. No tensor byte is read here.

`build_plan` opens the sources and hands them to a `Compilation`, whose methods are the steps: the
tensors' entries (`tensors`, run again over a training checkpoint's optimizer moments), the output's
metadata, what the target keeps beside its tensors, and the writer (a folder target's is
`folder_target.py`). The per-tensor steps that need none of its state are `steps.py`. Everything the
plan reads is read within one `ReadContext` (the limits and the storage options of its URLs).

The plan also holds the report a run would give (applied, skipped, missing, unused, errors), so
`migrate plan` can show it and `migrate run` can refuse to write anything when it has errors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import dtypes
from ..core.dtypes import DType
from ..core.errors import MigratorError, PlanError
from ..core.limits import DEFAULT_LIMITS, Limits
from ..core.scalars import Scalar
from ..core.tensor import LazyTensor
from ..core.version import __version__
from ..files.io import Reader, Writer, open_file, writer_class
from ..formats.registry import has_torch_names, is_format, target_format
from ..naming import NameFilter
from ..recipe.model import CastSpec, Recipe
from ..storage.paths import resolve_path
from ..storage.read_context import ReadContext
from ..storage.remote import as_path
from ..storage.remote.options import NO_STORAGE_OPTIONS, StorageOptions
from ..transform.modules import in_convert_syntax
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
from .steps import (
    Declarations,
    Item,
    adapted,
    alternative_name,
    by_name,
    check_name_lengths,
    enum_free,
    fit_to_slot,
    in_source_order,
    renamed,
)

if TYPE_CHECKING:
    from .sources import UnionReader
    from .training_state import Training
    from .vocabulary import Growth

HeadDim = tuple[int, str, str]
"""The head size the model's config declares, how, and the config's path (`_head_dim`)."""


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


@dataclass(frozen=True)
class RecipeFile:
    """What is known of the file a recipe was read from: its hash (written into the output's metadata)
    and where its modules, ops and `sources:` entries are written, so that an error found while
    planning names its recipe line (`LoadedRecipe`'s). A recipe made in code has its hash at most."""

    sha256: str | None = None
    module_origins: Mapping[tuple[str, int], str] | None = None
    op_origins: Mapping[tuple[int, str], tuple[str, int, int]] | None = None
    source_origins: Mapping[int, str] | None = None


def build_plan(recipe: Recipe, base_dir: Path, *, file: RecipeFile | None = None, hash_sources: bool = False,
               overwrite: bool | None = None, fsync: bool | None = None, limits: Limits = DEFAULT_LIMITS,
               hint_syntax: str = "recipe") -> Plan:
    """Open the files (headers only) and compile the recipe; the returned plan owns the open readers.
    `file`: the recipe's hash and recipe lines (`plan.loaded.plan_of` gives them). `hint_syntax`
    ("recipe" or "convert"): how a hint spells what to add (`modules:` or `--modules`). `limits`
    bounds what the source and template files may make their readers allocate."""
    file = file or RecipeFile()
    if recipe.unresolved_references:  # placeholders stand for them: never plan with those
        from ..recipe.issues import RecipeError

        raise RecipeError(recipe.unresolved_references)
    src_path = resolve_path(base_dir, recipe.inputs()[0].path)
    tgt_path = resolve_path(base_dir, recipe.target.path)
    tpl_path = resolve_path(base_dir, recipe.target.template) if recipe.target.template else None
    read = ReadContext(limits, storage_of(recipe, base_dir))
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
        reader: Reader = open_sources(recipe, base_dir, file.source_origins, read=read,
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
        from .sources import cast_of

        reader = open_source(spec, src_path, read=read, keep_structure=one_file or burn_keep, base_dir=base_dir,
                             training_state=recipe.training_state, dequantize=cast_of(recipe))
        inputs = [(str(src_path), src_path)]
    readers: list[Reader] = [reader]
    try:
        from ..files.sharded_writer import copy_folder

        places = Places(src_path, tgt_path, tpl_path,
                        record=None if recipe.target.optimizer is None else resolve_path(base_dir,
                                                                                         recipe.target.optimizer),
                        copy_from=None if recipe.target.copy_from is None else copy_folder(
                            resolve_path(base_dir, recipe.target.copy_from), tgt_path),
                        param_order=None if recipe.target.param_order is None else resolve_path(
                            base_dir, recipe.target.param_order))
        settings = Settings(overwrite=recipe.target.overwrite if overwrite is None else overwrite,
                            fsync=recipe.target.fsync if fsync is None else fsync, recipe_sha256=file.sha256,
                            hash_sources=hash_sources, hint_syntax=hint_syntax, module_origins=file.module_origins,
                            op_origins=file.op_origins, head_dim=_head_dim(recipe, base_dir),
                            config=_quantize_config(recipe, base_dir))
        from .vocabulary import growth

        grown = growth(recipe.add_tokens, base_dir, places.copy_from or reader.folder or src_path.parent,
                       reader.tensors, reader.label)
        plan = Compilation(recipe, reader, readers, out_fmt, places, read, settings, model_key, grown).plan()
        plan.inputs = inputs
        return plan
    except BaseException:
        for r in readers:
            r.close()
        raise


def _head_dim(recipe: Recipe, base_dir: Path) -> HeadDim | None:
    """The head size the model's config declares, for a recipe with `rope_permute` ops to be checked
    against (`recipe.config`); None without such ops or a config that says."""
    from ..ops.base import entry_op
    from ..recipe.config import ConfigError, find_config, head_dim_of, load_config

    if not any(entry_op(op)[0].reads_head_dim for op in recipe.ops):
        return None
    path = find_config(recipe.config, recipe.inputs()[0].path, base_dir)
    if path is None:
        return None
    try:
        found = head_dim_of(load_config(path))
    except ConfigError as e:
        raise PlanError(str(e), file=str(path)) from None
    return None if found is None else (found[0], found[1], os.path.normpath(path))


def _quantize_config(recipe: Recipe, base_dir: Path) -> Path | None:
    """The config.json `quantize:` reads (tied embeddings, a source quantized already), if any."""
    if recipe.quantize is None:
        return None
    from ..recipe.config import find_config

    path = find_config(recipe.config, recipe.inputs()[0].path, base_dir)
    return path if path is not None and path.name == "config.json" else None


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

    with open_source(recipe.source, resolve_path(base_dir, recipe.source.path),
                     read=ReadContext(limits, storage_of(recipe, base_dir)), base_dir=base_dir) as reader:
        return has_torch_names(reader)


@dataclass(frozen=True)
class Places:
    """Where a plan reads and writes, resolved against the recipe's folder."""

    source: Path
    target: Path
    template: Path | None = None
    record: Path | None = None  # Burn's optimizer record when the recipe names it (`target.optimizer`)
    copy_from: Path | None = None  # a folder target's companion files, when not the source's folder
    param_order: Path | None = None  # the new model whose order a kept optimizer's ids follow


@dataclass(frozen=True)
class Settings:
    """What the caller of `build_plan` decided beyond the recipe, and what its config says."""

    overwrite: bool
    fsync: bool
    recipe_sha256: str | None = None  # written into the output's metadata
    hash_sources: bool = False  # the sources' hashes too
    hint_syntax: str = "recipe"  # "convert": a hint spells `--modules`, not `modules:`
    module_origins: Mapping[tuple[str, int], str] | None = None  # a module-type error's recipe line
    op_origins: Mapping[tuple[int, str], tuple[str, int, int]] | None = None  # an op's error's recipe line
    head_dim: HeadDim | None = None  # what each rope_permute must agree with
    config: Path | None = None  # the config.json `quantize:` reads


@dataclass
class Compilation:
    """One recipe compiled against its open source (`reader`): the steps of a plan, as methods.
    `readers`: every reader the plan will own (a template's joins them); `fatal`: the problems that
    stop a run, gathered by every step."""

    recipe: Recipe
    reader: Reader
    readers: list[Reader]
    out_fmt: str
    places: Places
    read: ReadContext
    settings: Settings
    model_key: str | None = None  # training_state: keep under source.top_level_key
    growth: Growth | None = None  # add_tokens: rows added after the recipe's ops, tokenizer files written
    fatal: list[str] = field(default_factory=list)
    quantization: Any = None  # `quantize:`'s plan (transform.quantize.Quantization), once the entries are made

    def plan(self) -> Plan:
        """Every step; the plan's writer is planned only when no step found a fatal problem."""
        from .training_state import training_state

        recipe, reader, fatal = self.recipe, self.reader, self.fatal
        training = training_state(recipe, reader, self.out_fmt, self.places.template, fatal, self.model_key)
        entries, report, (record, pair) = self._entries(training)
        meta, notes = self._metadata(entries, report, training)
        kept: list[str] = []  # what keeping a checkpoint's structure says
        problems = len(fatal)
        structure = checkpoint_structure(recipe, reader, self.out_fmt, self.places.template,
                                         ((e.source, e.target) for e in entries if e.optimizer is None), kept, fatal,
                                         swap=training.swap)
        notes += kept
        flat = structure is None and len(fatal) == problems  # else the scalars are in the structure (or refused)
        scalars = target_scalars(recipe, reader, self.out_fmt, notes if flat else [], fatal)
        if training.burn:  # torch's parameter ids and names mean nothing beside a Burn model
            from .burn_optimizer import without_torch_ids

            if recipe.target.scalars == "keep":
                scalars = without_torch_ids(scalars, training)
            meta = {**without_torch_ids(meta, training), **recipe.target.metadata}
            if pair is not None:  # the stamp both files of the pair carry (plan/burn_pair.py)
                meta.update(pair.model_meta)
        places, settings = self.places, self.settings
        plan = Plan(places.source, reader.format, places.target, self.out_fmt, places.template, entries, report, meta,
                    scalars, settings.overwrite, settings.fsync, notes, fatal, self.readers, structure_notes=kept,
                    storage=self.read.storage)
        if not fatal:
            try:
                self._write(plan, training, structure, (record, pair))
            except MigratorError as e:
                fatal.append(str(e))
        return plan

    def _entries(self, training: Training) -> tuple[list[PlanEntry], ApplyReport, tuple[Any, Any]]:
        """Steps 1-4 for the model's tensors (in their own frame: their per-tensor intermediates are gone
        before the writer is planned), then a training checkpoint's optimizer state following them (in
        the new model's order when `target.param_order` gives it), and the problems of the report that
        stop a run. Also Burn's optimizer record and what pairs it with the model, when one is made."""
        recipe, fatal = self.recipe, self.fatal
        declares = Declarations()  # modules one declaration each would fix
        entries, report = self.tensors(training.model, template=self.places.template, fatal=fatal, declares=declares)
        if recipe.quantize is not None:
            entries = self._quantized(entries)
            report.quantized = self.quantization.summary()
        if training.optimizers:
            def replan(tensors: list[LazyTensor]) -> list[PlanEntry]:  # the same steps over moments
                return self.tensors(tensors, template=None, fatal=[], cast=False, moments=True)[0]

            from .optimizer_order import new_model_order

            order = new_model_order(self.places.param_order, training, fatal, self.read)
            entries += training.follow(self.reader, entries, replan, fatal, order)
            if is_format(self.reader.format, trainer_folder=True) and not training.burn:  # the Trainer's order
                from .trainer_target import in_trainer_order

                entries = in_trainer_order(training, self.reader, entries, fatal, self.places.copy_from,
                                           recipe.target.copies())
        elif self.places.param_order is not None:
            fatal.append("target.param_order orders a kept optimizer's ids: it needs training_state: keep, a .pt "
                         "target and a source with an optimizer")
        report.optimizer = training.fates
        entries = training.placed(entries)
        record = pair = None
        if training.burn:  # the model's tensors get param_ids; the optimizers' state becomes Burn's record
            from .burn_optimizer import default_record_path
            from .burn_pair import paired_record

            burnpack, target = writer_class("burnpack"), self.places.target
            entries, record, pair = paired_record(
                training, entries, self.reader, fatal, burnpack.resolve_path(target),
                burnpack.resolve_path(self.places.record or default_record_path(target)))
        for e in report.errors:
            if e.kind != "shape_mismatch" or recipe.validate_shapes:
                fatal.append(str(e) if self.settings.hint_syntax != "convert" else in_convert_syntax(str(e)))
        if declares.wanted:
            from ..transform.modules import declaration_hint

            fatal.append(declaration_hint(declares.wanted, declares.paths, self.settings.hint_syntax))
        return entries, report, (record, pair)

    def _quantized(self, entries: list[PlanEntry]) -> list[PlanEntry]:
        """The entries with each Linear weight `quantize:` takes replaced by its F8_E4M3 weight and its
        weight_scale (`transform.quantize`); what it keeps, and why, goes to the notes."""
        from ..recipe.config import ConfigError, load_config
        from ..transform.quantize import SourceFacts, plan_quantization

        recipe, path = self.recipe, self.settings.config
        assert recipe.quantize is not None
        config = None
        if path is not None:
            try:
                config = load_config(path)
            except ConfigError as problem:
                self.fatal.append(str(problem))
        settings = self.settings
        source = SourceFacts(self.reader.format, config, None if path is None else os.fspath(path),
                             dequantized="quantization_config" in self.reader.config_drop)
        q = self.quantization = plan_quantization(
            recipe.quantize.scheme, recipe.quantize.ignore, [e.tensor for e in entries], recipe.modules,
            settings.module_origins, source, settings.hint_syntax)
        self.fatal += [m if settings.hint_syntax != "convert" else in_convert_syntax(m) for m in q.fatal]
        out: list[PlanEntry] = []
        for i, e in enumerate(entries):
            pair = q.replaced.get(i)
            if pair is None:
                out.append(e)
                continue
            weight, scale = pair
            out.append(PlanEntry(e.target, e.source, weight, e.source_tensor, (*e.ops, q.op(weight, scale)), e.module))
            out.append(PlanEntry(scale.name, e.source, scale, e.source_tensor, (f"weight_scale of {e.target}",)))
        return out

    def _metadata(self, entries: list[PlanEntry], report: ApplyReport, training: Training
                  ) -> tuple[dict[str, str], list[str]]:
        """Step 5: the output's metadata (with the recipe's and the sources' hashes where the format holds
        them), and the notes so far (an optimizer's state written as weights is said, or refused)."""
        recipe, reader, out_fmt, settings = self.recipe, self.reader, self.out_fmt, self.settings
        meta = output_metadata(reader.format, out_fmt, reader.metadata, extra=recipe.target.metadata,
                               clear=recipe.target.clear_metadata)
        notes: list[str] = list(reader.notes)  # what a source did on its own (a LoRA fold)
        notes += training.notes
        if self.quantization is not None:
            notes += self.quantization.notes
        if not training.trainer:  # a Trainer folder target writes the optimizer's state into its optimizer.pt
            optimizer_as_weights([e.target for e in entries], out_fmt, folder=recipe.target.shard is not None,
                                 hint_syntax=settings.hint_syntax, notes=notes, fatal=self.fatal)
        if is_format(out_fmt, metadata="text") and not recipe.target.clear_metadata:
            if settings.recipe_sha256:
                meta[RECIPE_HASH_KEY] = settings.recipe_sha256
                meta[VERSION_KEY] = __version__
            if settings.hash_sources:
                from .sources import hash_metadata

                meta.update(hash_metadata(reader, self.places.source, self.read.storage))
                if self.places.template is not None:
                    meta[TEMPLATE_HASH_KEY] = sha256_file(self.places.template, self.read.storage)
            loadable_metadata(meta, out_fmt)  # the provenance keys alone must not make it unloadable
        if report.renumbered:
            shown = ", ".join(f"{old} -> {new}" for old, new in report.renumbered[:5])
            more = f" and {len(report.renumbered) - 5} more" if len(report.renumbered) > 5 else ""
            notes.append(f"renumbered {len(report.renumbered)} names to contiguous indices (contiguous_indices; "
                         f"Burn's Vec<Module> has no gaps): {shown}{more}")
        return meta, notes

    def _write(self, plan: Plan, training: Training, structure: Any, burn: tuple[Any, Any]) -> None:
        """The plan's writer (a Trainer folder, a folder of shards, or one file keeping `structure`), and
        Burn's optimizer record beside it (`burn`: the record and what stamps it as one pair with the model)."""
        recipe, reader, out_fmt, notes = self.recipe, self.reader, self.out_fmt, plan.notes
        record, pair = burn
        tensors = [e.tensor for e in plan.entries]
        if training.trainer:  # the model's files, optimizer.pt and the Trainer's other files
            from ..files.sharded_writer import FolderLayout, default_weights_name
            from .trainer_target import trainer_writer

            assert recipe.target.shard is not None
            if recipe.target.config or self.growth is not None:  # its files are the Trainer's own
                raise PlanError("target.config and add_tokens are not supported with a Trainer checkpoint folder "
                                "target; write a model folder")
            layout = FolderLayout(max_size=recipe.target.shard.max_size, copies=recipe.target.copies(),
                                  copy_from=self.places.copy_from or reader.folder,
                                  weights_name=recipe.target.shard.name or default_weights_name(out_fmt, reader.folder),
                                  storage=self.read.storage)
            plan.writer = trainer_writer(training, plan.entries, reader, out_fmt, scalars=plan.scalars, folder=layout,
                                         **self.writer_options(plan.metadata, notes, folder_target=True))
            notes += plan.writer.notes
        elif recipe.target.shard is not None:
            from .folder_target import folder_writer

            folder_writer(self, plan)
        else:
            if recipe.target.hf_config:
                raise PlanError("target.hf_config writes a config.json into a folder target (end the path with '/')")
            if self.growth is not None:
                raise PlanError("add_tokens writes the tokenizer files beside the weights: write a folder target (end "
                                "the path with '/')")
            if recipe.target.config:
                raise PlanError("target.config edits the config.json of a folder target (end the path with '/' and "
                                "copy config.json)")
            tree: dict[str, Any] = {} if structure is None else {"structure": structure}
            options = self.writer_options(plan.metadata, notes)
            made_tensors = options.pop("made_tensors", [])  # a GGUF's rope_freqs.weight
            plan.writer = writer_class(out_fmt)(tensors + made_tensors, scalars=plan.scalars, **options, **tree)
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
                plan.scheduler_path = default_scheduler_path(self.places.target)
                notes.append(f"Burn's LR scheduler record: {plan.scheduler_path}, written with them")

    def tensors(self, tensors: list[LazyTensor] | None, *, template: Path | None, fatal: list[str],
                declares: Declarations | None = None, cast: bool = True,
                moments: bool = False) -> tuple[list[PlanEntry], ApplyReport]:
        """Steps 1-4: the entries and report of `tensors` (None: the reader's; a training checkpoint's model,
        or its optimizer moments in their parameters' places), slotted into `template` if any; problems
        that stop a run are added to `fatal`. `cast`: whether the dtype policy applies (moments keep their
        dtype); `moments`: the tensors are optimizer moments (an op adding rows gives them zeros there)."""
        recipe, reader, limits = self.recipe, self.reader, self.read.limits
        for_burn, op_origins = recipe.for_burn(self.out_fmt), self.settings.op_origins
        is_pytorch = has_torch_names(reader)
        tensors = reader.tensors if tensors is None else tensors
        names = [t.name for t in tensors]
        check_name_lengths(names, limits, reader.label)
        renumbered: list[tuple[str, str]] = []
        current, ops = renamed(recipe, names, is_pytorch and for_burn, reader.label, reader.describe,
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
        all_ops = [*recipe.ops, *(self.growth.ops if self.growth is not None else [])]
        if all_ops:
            from ..transform.ops import apply_ops

            done = apply_ops(all_ops, kept, kept_names, ops, op_origins, head_dim=self.settings.head_dim,
                             for_state=moments)
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
                                      list(zip(current, [t.shape for t in tensors], strict=True)),
                                      self.settings.module_origins,
                                      reader.format)
        del names, current
        items = adapted(kept, kept_names, ops, adapter, resolver, errors, made, declares)

        # 4. template slots, or the source order when there is no template
        cast_to = dtypes.parse(recipe.dtype.cast) if isinstance(recipe.dtype, CastSpec) and cast else None
        missing: list[tuple[str, str]] = []
        unused: list[str] = []
        if template is not None:
            found = by_name(items, fatal)  # a template looks sources up by name
            entries, applied, missing, unused = self._fill_template(template, found, (adapter, resolver), cast_to,
                                                                    errors, fatal)
            unused_from = [found[n][0].name for n in unused]
            sources = [e.source for e in entries if e.source is not None and not e.kept_from_template]
        else:
            resolver = None  # the generator holds it only while it runs: 100k modules' params are freed with it
            entries, applied = in_source_order(items, cast_to)
            sources = [e.source for e in entries]  # type: ignore[misc]  # every entry has a source here
            if len(set(applied)) != len(applied):  # only to name the clash
                by_name(((e.source_tensor, e.tensor, e.ops, e.module) for e in entries), fatal)  # type: ignore[misc]
            if recipe.dtype == "template":
                fatal.append("dtype: template needs target.template")
        from .sources import UnionReader, add_provenance

        if isinstance(reader, UnionReader):  # several sources: each renumbered its own names
            renumbered = reader.renumbered
        report = ApplyReport(applied=applied, skipped=sorted(skipped), missing=sorted(missing), unused=unused,
                             errors=errors, sources=sources, ops=op_nodes, renumbered=renumbered,
                             consumed=list(reader.consumed) if cast else [])
        if declares is not None and declares.wanted:  # the hint's patterns must not match other modules
            from ..transform.modules import module_path

            declares.paths = list(dict.fromkeys(module_path(n) for n in kept_names))
        if isinstance(reader, UnionReader):  # several sources: say which one each tensor came from
            add_provenance(report, reader, list(zip(skipped, skipped_from, strict=True)),
                           list(zip(unused, unused_from, strict=True)) if template is not None else [])
        return entries, report

    def _fill_template(self, template_path: Path, found: dict[str, Item], adapting: tuple[Any, Any],
                       cast_to: DType | None, errors: list[ReportError], fatal: list[str]
                       ) -> tuple[list[PlanEntry], list[str], list[tuple[str, str]], list[str]]:
        """An entry per template slot, from the results `found` by name (`adapting`: the adapter and the
        module resolver, whose alternative names a slot may also take): entries, applied, missing and
        unused names."""
        recipe, (adapter, resolver), limits = self.recipe, adapting, self.read.limits
        is_pytorch = has_torch_names(self.reader)
        entries: list[PlanEntry] = []
        missing: list[tuple[str, str]] = []
        applied: list[str] = []
        template = open_file(template_path, recipe.target.template_format, **self.read.options())
        self.readers.append(template)
        if recipe.source is None:
            from .sources import skip_enum_variants

            skip_enum = skip_enum_variants(recipe, is_pytorch)
        else:
            chosen = recipe.source.skip_enum_variants
            skip_enum = is_pytorch if chosen is None else chosen
        without_enums = {enum_free(n): n for n in found} if skip_enum else {}

        def lookup(name: str) -> str | None:
            key = name if name in found else None
            if key is None and skip_enum:
                key = without_enums.get(enum_free(name))
            if key is None and adapter is not None:
                key = alternative_name(adapter, resolver, name, found)
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
            entry = fit_to_slot(slot, found[key], recipe, cast_to, errors)
            entries.append(entry)
            if not entry.kept_from_template:
                applied.append(slot.name)
        unused = sorted(n for n in found if n not in used)
        if missing and not recipe.allow_partial:
            fatal.append(f"{len(missing)} template tensors have no source (set allow_partial to keep the template's "
                         "values)")
        return entries, applied, missing, unused

    def writer_options(self, meta: dict[str, str], notes: list[str], *, folder_target: bool = False
                        ) -> dict[str, Any]:
        """The writer's metadata, and options only one format's writer takes: a GGUF target's per-tensor
        quantization rules, its key/values with a tokenizer's (target.tokenizer, relative to the
        source's folder), and the tensors it is given (`made_tensors`: rope_freqs.weight). A folder
        target's rope_scaling with hf_config is its config.json's (`folder_target.made_files`)."""
        recipe, reader, out_fmt, src_path = self.recipe, self.reader, self.out_fmt, self.places.source
        target = recipe.target
        rope_tensor = target.rope_scaling is not None and not (folder_target and target.hf_config)
        if (target.quantize or target.tokenizer or rope_tensor) and not is_format(out_fmt, llama_cpp=True):
            raise PlanError("target.quantize, target.tokenizer and target.rope_scaling apply to GGUF targets; this "
                            f"target is {out_fmt}")
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
                         f"target.rope_scaling (llama3, factor {scaling['factor']}), as llama.cpp's converter writes "
                         "them")
        if target.tokenizer:
            from ..formats.gguf.tokenizer import tokenizer_key_values

            folder = Path(reader.folder or src_path.parent)
            tokenizer, said = tokenizer_key_values(folder / target.tokenizer)
            notes += said
            given = {k: v for k, v in meta.items() if k in target.metadata}  # the recipe's own word wins (e.g. .pre)
            meta = {**meta, **tokenizer, **given}
        return {"quantize": target.quantize, "metadata": meta, "made_tensors": made_tensors}

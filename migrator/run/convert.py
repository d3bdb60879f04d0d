"""`migrate convert`: a one-off conversion that builds a recipe in memory and runs it.

Plain by default (every tensor, same bytes): burnpack -> burnpack with nothing changed is
byte-identical. PyTorch index renumbering follows the recipe default: on for a PyTorch source whose
output is for Burn (a burnpack target or the `pytorch_to_burn` adapter), as Burn's PyTorch store
does (`features.0, features.2` become `features.0, features.1`), off for SafeTensors and PyTorch
targets, which must keep the names the PyTorch module loads. `contiguous_indices=False` keeps the
names, True renumbers any source. `emit_recipe` gives the
YAML to check in, so a one-off can become a recipe.

A conversion with nothing to rename, filter, adapt or cast skips the recipe machinery (pydantic
alone costs ~0.2 s of start-up, a third of copying a 1.4 GB model): `_plain_copy` does exactly
what the plan would do for such a recipe, which tests/run/test_convert_plain.py checks file by file.
A PyTorch source whose names renumbering for a burnpack would change is handed to the recipe path
instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import MigratorError, not_written
from ..core.limits import DEFAULT_LIMITS, Limits
from ..formats.registry import has_torch_names
from ..recipe.convert import ConvertUsageError, build_recipe
from ..recipe.convert_options import PLAIN, ConvertOptions
from ..storage.remote import as_path

if TYPE_CHECKING:
    from ..formats.base import Writer
    from ..plan.build import Plan


@dataclass
class ConvertResult:
    source: str
    source_format: str
    target: str
    target_format: str
    tensors: int
    nbytes: int
    metadata: dict[str, str]
    scalars_written: int
    notes: list[str] = field(default_factory=list)
    renumbered: list[dict[str, str]] = field(default_factory=list)
    """{"from", "to"} per tensor name whose index segments were renumbered (contiguous_indices)."""


PLAIN_OPTIONS = PLAIN
"""Options a plain copy understands (`ConvertOptions`' rows say which); anything else set (remaps, filters,
adapters, dtype, forced indices, top-level key) goes through a recipe. `contiguous_indices` None/False is
understood too."""


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], options: ConvertOptions | None = None, /, *,
            progress: bool | None = None, recipe_sha256: str | None = None, limits: Limits = DEFAULT_LIMITS,
            **changes: Any) -> ConvertResult:
    """Convert `src` to `dst` atomically, one tensor at a time: `options` (a `ConvertOptions`, whose
    fields may also be given or changed as keywords; see `build_recipe`).

    `recipe_sha256`: the hash of the recipe this conversion is recorded as (`--emit-recipe -o`), put
    in the output's metadata as `migrate run` of that recipe puts it, so both write the same bytes.
    `limits` bounds what the source may make its reader allocate."""
    from ..recipe.convert import llama_config, llama_gguf, lora_adapter

    o = replace(options or ConvertOptions(), **changes)
    given = o.given()
    if (recipe_sha256 is None and all(k in PLAIN_OPTIONS or not v for k, v in given.items())
            and not lora_adapter(src, dst, o.target_format_name)
            and llama_config(src, dst, o.target_format_name) is None
            and llama_gguf(src, dst, o.max_shard_size, o.target_format_name) is None):
        done = _plain_copy(src, dst, o, progress=progress, limits=limits)
        if done is not None:
            return done
    from ..plan.build import RecipeFile, build_plan
    from .execute import run_plan

    recipe = build_recipe(src, dst, o)
    if recipe.target.shard is not None:  # an existing folder is refused before any source is opened
        from ..files.targets import check_folder_target
        from ..storage.paths import resolve_path

        check_folder_target(resolve_path(Path.cwd(), dst), overwrite=recipe.target.overwrite)
    with build_plan(recipe, Path.cwd(), file=RecipeFile(recipe_sha256), limits=limits,
                    hint_syntax="convert") as plan:
        result = run_plan(plan, progress=progress)
        return _result(plan, result.target)


def _plain_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str], o: ConvertOptions, *,
                progress: bool | None, limits: Limits = DEFAULT_LIMITS) -> ConvertResult | None:
    """Every tensor as it is, into another file: what build_plan + run_plan do for a plain recipe.
    None (nothing written) for a PyTorch source that the default renumbering for a burnpack target
    would rename, and for a PyTorch checkpoint with a structure (nested dicts, optimizer state, epoch)
    written to PyTorch: the recipe path does those (and says so).

    (No collision check: every reader refuses files that name a tensor twice.)
    """
    from ..files.io import open_file, save_planned
    from ..formats.registry import is_format, target_format, writer_class
    from ..naming.optimizer_names import optimizer_owners
    from ..plan.metadata import output_metadata
    from ..storage.atomic import Protected
    from ..storage.paths import resolve_path
    from .execute import MigrationError, progress_for

    src_path, dst_path = resolve_path(Path.cwd(), src), resolve_path(Path.cwd(), dst)
    sharded = o.max_shard_size is not None or os.fspath(dst).endswith(("/", os.sep))
    if sharded:  # as a recipe's sharded target: format named, else from a suffix, else SafeTensors
        from ..files.sharded_writer import DEFAULT_MAX_SIZE, FolderLayout, ShardedWriter
        from ..files.targets import check_folder_target

        out_fmt = target_format(dst_path, o.target_format_name, sharded=True)
        check_folder_target(dst_path, overwrite=o.overwrite)  # before the source is opened
    else:
        if o.copy or o.copy_from:
            option = "--copy" if o.copy else "--copy-from"
            raise ConvertUsageError(f"{option} needs a folder target (end DST with '/' or give --max-shard-size)")
        if o.weights_name is not None:
            raise ConvertUsageError("--weights-name names the weights in a folder target: end DST with '/'")
        out_fmt = target_format(dst_path, o.target_format_name)
        dst_path = as_path(writer_class(out_fmt).resolve_path(dst_path))
    keep = is_format(out_fmt, keeps_structure=True) and not sharded
    structure: dict[str, Any] = {"keep_structure": True} if keep else {}
    with open_file(src_path, o.source_format, limits=limits, **structure) as reader:
        if reader.structure is not None:
            return None  # a checkpoint's structure is written back by the plan (`plan.build._structure`)
        tensors = list(reader.tensors)
        if not is_format(out_fmt, keeps_structure=True) and optimizer_owners(t.name for t in tensors):
            return None  # a training checkpoint's optimizer as weights: the plan refuses or says so
        if has_torch_names(reader) and o.contiguous_indices is None and is_format(out_fmt, for_burn=True):
            from ..naming import contiguous_names

            names = [t.name for t in tensors]
            if contiguous_names(names) != names:
                return None
        meta = output_metadata(reader.format, out_fmt, reader.metadata, extra=o.metadata, clear=o.clear_metadata)
        notes: list[str] = list(reader.notes)  # e.g. the optimizer state a top_level_key leaves out
        scalars = dict(reader.scalars) if is_format(out_fmt, scalars=True) else {}
        if reader.scalars and not is_format(out_fmt, scalars=True):
            notes.append(f"{len(reader.scalars)} source scalars not written: {out_fmt} has no typed scalars")
        writer: Writer
        try:
            if sharded:
                from ..files.sharded_writer import copy_folder, default_weights_name
                from ..recipe.convert import COMPANIONS

                folder = reader.folder
                companions = copy_folder(resolve_path(Path.cwd(), o.copy_from), dst_path) if o.copy_from else None
                layout = FolderLayout(
                    max_size=DEFAULT_MAX_SIZE if o.max_shard_size is None else o.max_shard_size,
                    copies=[(c, False) for c in o.copy] or ([(c, True) for c in COMPANIONS] if o.copy_from else []),
                    copy_from=companions or folder or src_path.parent,
                    weights_name=o.weights_name or default_weights_name(out_fmt, folder))
                writer = ShardedWriter(out_fmt, tensors, metadata=meta, scalars=scalars, folder=layout)
                notes += writer.notes
            else:
                writer = writer_class(out_fmt)(tensors, metadata=meta, scalars=scalars)
                notes += writer.notes  # e.g. a GGUF file without general.architecture
        except MigratorError as e:
            raise MigrationError(not_written([str(e)]), file=str(dst_path)) from None
        source = reader.source
        read: list[Protected] = [src_path, *([source.identity] if source.identity is not None
                                              else source.identities)]
        written = save_planned(writer, dst_path, overwrite=o.overwrite, protect=read, progress=progress_for(progress),
                               fsync=o.fsync, mode_from=[source.mode] if source.mode is not None else [],
                               make_folders=True)
        return ConvertResult(source=str(src_path), source_format=reader.format, target=written,
                             target_format=out_fmt, tensors=len(tensors), nbytes=sum(t.nbytes for t in tensors),
                             metadata=meta, scalars_written=len(scalars), notes=notes)


def _result(plan: Plan, written: str) -> ConvertResult:
    return ConvertResult(
        source=str(plan.source_path), source_format=plan.source_format, target=written,
        target_format=plan.target_format, tensors=len(plan.entries),
        nbytes=sum(e.tensor.nbytes for e in plan.entries), metadata=plan.metadata,
        scalars_written=len(plan.scalars), notes=plan.notes,
        renumbered=[{"from": old, "to": new} for old, new in plan.report.renumbered],
    )

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
what the plan would do for such a recipe, which tests/test_convert_plain.py checks file by file.
A PyTorch source whose names renumbering for a burnpack would change is handed to the recipe path
instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import adapter_names
from .errors import MigratorError
from .limits import DEFAULT_LIMITS, Limits
from .remote import as_path

if TYPE_CHECKING:
    from .formats import Writer
    from .plan import Plan
    from .recipe import Recipe


class ConvertUsageError(MigratorError):
    """A convert option is malformed (e.g. --remap without '=')."""


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


def build_recipe(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    source_format: str = "auto",
    target_format_name: str = "auto",
    top_level_key: str | None = None,
    remaps: Sequence[str] = (),
    includes: Sequence[str] = (),
    excludes: Sequence[str] = (),
    adapters: Sequence[str] = (),
    dtype: str | None = None,
    modules: Sequence[str] = (),
    contiguous_indices: bool | None = None,
    overwrite: bool = False,
    fsync: bool = True,
    metadata: Mapping[str, str] | None = None,
    clear_metadata: bool = False,
    max_shard_size: str | int | None = None,
    copy: Sequence[str] = (),
    weights_name: str | None = None,
    copy_from: str | os.PathLike[str] | None = None,
) -> Recipe:
    """The recipe equivalent to a `migrate convert` command line (validated like any recipe).

    `adapters` are names or `float_cast:DTYPE`; `modules` are `TYPE=REGEX`. A value the recipe
    model refuses raises ConvertUsageError with the recipe's message and hint, naming the option.
    """
    remap = []
    for item in remaps:
        pattern, sep, repl = item.partition("=")
        if not sep or not pattern:
            raise ConvertUsageError(f"--remap expects 'REGEX=REPLACEMENT', got {item!r}")
        remap.append({"from": pattern, "to": repl})
    data: dict[str, Any] = {
        "version": 1,
        "source": {"path": os.fspath(src), "format": source_format},
        "remap": remap,
        "target": {"path": os.fspath(dst), "format": target_format_name, "overwrite": overwrite, "fsync": fsync,
                   "metadata": dict(metadata or {}), "clear_metadata": clear_metadata},
    }
    if contiguous_indices is not None:  # None: the recipe's default (on for PyTorch sources)
        data["source"]["contiguous_indices"] = contiguous_indices
    if top_level_key:
        data["source"]["top_level_key"] = top_level_key
    if max_shard_size is not None or os.fspath(dst).endswith(("/", os.sep)):  # DIR/: a Hugging Face folder
        from .formats.sharded_writer import DEFAULT_MAX_SIZE

        data["target"]["shard"] = {"max_size": DEFAULT_MAX_SIZE if max_shard_size is None else max_shard_size}
        if weights_name is not None:
            data["target"]["shard"]["name"] = weights_name
    elif weights_name is not None:
        raise ConvertUsageError("--weights-name names the weights in a folder target: end DST with '/'")
    if copy:
        data["target"]["copy"] = list(copy)
    if copy_from is not None:
        data["target"]["copy_from"] = os.fspath(copy_from)
    if includes or excludes:
        data["filter"] = {"include": [{"regex": r} for r in includes] or None,
                          "exclude": [{"regex": r} for r in excludes]}
    if adapters:
        data["adapters"] = [_adapter_spec(a) for a in adapters]
    if dtype:
        data["dtype"] = {"cast": dtype}
    declared: dict[str, list[str]] = {}
    module_options: list[tuple[str, int, str]] = []  # (type, index in its list, option as given)
    for item in modules:
        type_name, sep, pattern = item.partition("=")
        if not sep or not type_name.strip() or not pattern:
            raise ConvertUsageError(f"--modules expects TYPE=REGEX (e.g. Linear='^fc\\d+$'), got {item!r}")
        module_options.append((type_name, len(declared.setdefault(type_name, [])), item))
        declared[type_name].append(pattern)
    if declared:
        data["modules"] = declared
    from pydantic import ValidationError

    from .recipe import Recipe

    try:
        return Recipe.model_validate(data)
    except ValidationError:
        raise _usage_error(data, module_options) from None


_ADAPTER_FORMS = adapter_names.CLI_FORMS


def _adapter_spec(value: str) -> str | dict[str, Any]:
    """`--adapter NAME` or `--adapter float_cast:DTYPE` as the recipe spells it."""
    name, sep, arg = value.partition(":")
    if name == "float_cast":
        if not arg:
            raise ConvertUsageError(f"--adapter '{value}': float_cast needs a dtype, e.g. --adapter float_cast:BF16 "
                                    "(or --dtype BF16, the recipe's dtype cast of every float tensor)")
        return {"float_cast": {"to": arg}}
    if sep or name not in _ADAPTER_FORMS:
        from .similarity import did_you_mean

        guess = did_you_mean(value, list(_ADAPTER_FORMS))
        lead = f"did you mean '{guess}'? " if guess else ""
        raise ConvertUsageError(f"--adapter: unknown adapter '{value}' (hint: {lead}valid adapters: "
                                f"{', '.join(_ADAPTER_FORMS)})")
    return name


def _usage_error(data: dict[str, Any], module_options: list[tuple[str, int, str]]) -> ConvertUsageError:
    """The recipe loader's messages for what the model refused (the same words as for a recipe
    file: "did you mean 'F16'?"), each naming the command-line option instead of a recipe line."""
    import yaml

    from .recipe_loader import RecipeError, parse_recipe

    try:
        parse_recipe(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    except RecipeError as e:
        lines = [f"{_option_for(issue.loc, data, module_options)}: {issue.message}"
                 + (f" (hint: {issue.hint})" if issue.hint else "") for issue in e.issues]
        return ConvertUsageError("invalid option:\n  " + "\n  ".join(lines))
    return ConvertUsageError("invalid option")  # the loader accepts what the model refused: not expected


def _option_for(loc: str, data: dict[str, Any], module_options: list[tuple[str, int, str]]) -> str:
    """The option (and value) a recipe location comes from, e.g. 'adapters[1].float_cast.to' -> --adapter."""
    import re

    head = re.match(r"([a-z_]+)(?:\.([^.\[]+))?(?:\[(\d+)\])?", loc)
    if head is None:
        return "option"
    first, second, index = head.group(1), head.group(2), head.group(3)
    n = int(index) if index is not None else None
    if first == "adapters" and n is not None:
        spec = data["adapters"][n]
        return "--adapter '" + (spec if isinstance(spec, str) else f"float_cast:{spec['float_cast']['to']}") + "'"
    if first == "modules" and second is not None and n is not None:
        given = [item for type_name, i, item in module_options if type_name == second and i == n]
        return f"--modules '{given[0]}'" if given else "--modules"
    if first == "remap" and n is not None:
        rule = data["remap"][n]
        return f"--remap '{rule['from']}={rule['to']}'"
    if first == "filter" and second in ("include", "exclude") and n is not None:
        return f"--{second} '{data['filter'][second][n]['regex']}'"
    names: dict[str, str | dict[str, str]] = {
        "dtype": "--dtype", "source": {"top_level_key": "--top-level-key", "format": "--from", "path": "SRC"},
        "target": {"format": "--to", "metadata": "--metadata", "path": "DST"}}
    found = names.get(first, first)
    return found.get(second or "", first) if isinstance(found, dict) else found


def emit_recipe(recipe: Recipe, out: str | os.PathLike[str] | None = None) -> str:
    """The recipe as YAML to check in. With `out` (the file it will be written to), its paths are
    made relative to that file's folder, as a recipe's paths are read; without, they stay as given
    (relative to the current folder, where a recipe printed to stdout is usually saved)."""
    import yaml

    data = recipe.dump()
    if out is not None:
        folder = os.path.dirname(os.path.abspath(out))
        data["source"]["path"] = _relative_to(data["source"]["path"], folder)
        data["target"]["path"] = _relative_to(data["target"]["path"], folder)
        if data["target"].get("template"):
            data["target"]["template"] = _relative_to(data["target"]["template"], folder)
    return schema_line() + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _relative_to(path: str, folder: str) -> str:
    """A command-line path (relative to the current folder) as seen from `folder`; a trailing '/'
    (a folder target) is kept."""
    rel = os.path.relpath(os.path.abspath(os.path.expanduser(path)), folder)
    return rel + "/" if path.endswith(("/", os.sep)) and not rel.endswith("/") else rel


def schema_line() -> str:
    """The yaml-language-server line naming the recipe schema: the schema file of this installation
    as an absolute file URL when it is there (a checkout or an editable install), else how to make one."""
    schema = Path(__file__).resolve().parent.parent / "schemas" / "recipe.schema.json"
    if schema.is_file():
        return f"# yaml-language-server: $schema={schema.as_uri()}\n"
    return ("# schema: run `migrate schema -o recipe.schema.json` and add the line\n"
            "# yaml-language-server: $schema=recipe.schema.json\n")


PLAIN_OPTIONS = frozenset({"source_format", "target_format_name", "overwrite", "fsync", "metadata",
                           "clear_metadata", "max_shard_size", "copy", "weights_name", "copy_from"})
"""Options a plain copy understands; anything else set (remaps, filters, adapters, dtype, forced
indices, top-level key) goes through a recipe. `contiguous_indices` None/False is understood too."""


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, progress: bool | None = None,
            recipe_sha256: str | None = None, limits: Limits = DEFAULT_LIMITS, **options: Any) -> ConvertResult:
    """Convert `src` to `dst` atomically, one tensor at a time (see `build_recipe` for options).

    `recipe_sha256`: the hash of the recipe this conversion is recorded as (`--emit-recipe -o`), put
    in the output's metadata as `migrate run` of that recipe puts it, so both write the same bytes.
    `limits` bounds what the source may make its reader allocate."""
    if recipe_sha256 is None and all(k in PLAIN_OPTIONS or not v for k, v in options.items()):
        done = _plain_copy(src, dst, progress=progress, limits=limits, **options)
        if done is not None:
            return done
    from .execute import run_plan
    from .plan import build_plan

    recipe = build_recipe(src, dst, **options)
    if recipe.target.shard is not None:  # an existing folder is refused before any source is opened
        from .paths import resolve_path
        from .remote import check_folder_target

        check_folder_target(resolve_path(Path.cwd(), dst), overwrite=recipe.target.overwrite)
    with build_plan(recipe, Path.cwd(), recipe_sha256=recipe_sha256, limits=limits, hint_syntax="convert") as plan:
        result = run_plan(plan, progress=progress)
        return _result(plan, result.target)


def _plain_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, progress: bool | None,
                source_format: str = "auto", target_format_name: str = "auto", overwrite: bool = False,
                fsync: bool = True, metadata: Mapping[str, str] | None = None, clear_metadata: bool = False,
                max_shard_size: str | int | None = None, copy: Sequence[str] = (),
                contiguous_indices: bool | None = None, limits: Limits = DEFAULT_LIMITS,
                weights_name: str | None = None, copy_from: str | os.PathLike[str] | None = None,
                **_: Any) -> ConvertResult | None:
    """Every tensor as it is, into another file: what build_plan + run_plan do for a plain recipe.
    None (nothing written) for a PyTorch source that the default renumbering for a burnpack target
    would rename, and for a PyTorch checkpoint with a structure (nested dicts, optimizer state, epoch)
    written to PyTorch: the recipe path does those (and says so).

    (No collision check: every reader refuses files that name a tensor twice.)
    """
    from .atomic import Protected
    from .execute import MigrationError, progress_for
    from .formats import open_file, save_planned, writer_class
    from .formats.detect import target_format
    from .metadata import output_metadata
    from .paths import resolve_path

    src_path, dst_path = resolve_path(Path.cwd(), src), resolve_path(Path.cwd(), dst)
    sharded = max_shard_size is not None or os.fspath(dst).endswith(("/", os.sep))
    if sharded:  # as a recipe's sharded target: format named, else from a suffix, else SafeTensors
        from .formats.detect import from_extension
        from .formats.sharded_writer import DEFAULT_MAX_SIZE, ShardedWriter
        from .remote import check_folder_target

        out_fmt = target_format_name if target_format_name != "auto" else from_extension(dst_path) or "safetensors"
        check_folder_target(dst_path, overwrite=overwrite)  # before the source is opened
    else:
        if copy:
            raise ConvertUsageError("--copy needs a folder target (end DST with '/' or give --max-shard-size)")
        if weights_name is not None:
            raise ConvertUsageError("--weights-name names the weights in a folder target: end DST with '/'")
        out_fmt = target_format(dst_path, target_format_name)
        dst_path = as_path(writer_class(out_fmt).resolve_path(dst_path))
    structure = {"keep_structure": True} if out_fmt == "pytorch" and not sharded else {}
    with open_file(src_path, source_format, limits=limits, **structure) as reader:
        if getattr(reader, "structure", None) is not None:
            return None  # a checkpoint's structure is written back by the plan (`plan._structure`)
        tensors = list(reader.tensors)
        if reader.format == "pytorch" and contiguous_indices is None and out_fmt == "burnpack":
            from .naming import contiguous_names

            names = [t.name for t in tensors]
            if contiguous_names(names) != names:
                return None
        meta = output_metadata(reader.format, out_fmt, reader.metadata, extra=metadata, clear=clear_metadata)
        notes: list[str] = []
        scalars = dict(reader.scalars) if out_fmt == "burnpack" else {}
        if reader.scalars and out_fmt != "burnpack":
            notes.append(f"{len(reader.scalars)} source scalars not written: {out_fmt} has no typed scalars")
        writer: Writer
        try:
            if sharded:
                from .formats.sharded_writer import copy_folder, default_weights_name

                folder = getattr(reader, "folder", None)
                companions = copy_folder(resolve_path(Path.cwd(), copy_from), dst_path) if copy_from else None
                writer = ShardedWriter(out_fmt, tensors, metadata=meta, scalars=scalars,
                                       max_size=DEFAULT_MAX_SIZE if max_shard_size is None else max_shard_size,
                                       copies=[(c, False) for c in copy],
                                       copy_from=companions or folder or src_path.parent,
                                       weights_name=weights_name or default_weights_name(out_fmt, folder))
                notes += writer.notes
            else:
                writer = writer_class(out_fmt)(tensors, metadata=meta, scalars=scalars)
        except MigratorError as e:
            raise MigrationError("migration not written:\n  " + str(e), file=str(dst_path)) from None
        source = reader.source
        read: list[Protected] = [src_path] + ([source.identity] if hasattr(source, "identity")
                                              else getattr(source, "identities", []))
        written = save_planned(writer, dst_path, overwrite=overwrite, protect=read, progress=progress_for(progress),
                               fsync=fsync, mode_from=[source.mode] if hasattr(source, "mode") else [],
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

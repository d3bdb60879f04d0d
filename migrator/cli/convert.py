"""`migrate convert SRC DST`: a one-off conversion (`run/convert.py`), its options checked as a
recipe would check them; `--emit-recipe` writes the recipe of what ran."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Any

from ..core.errors import EXIT_OK, EXIT_USAGE
from ..recipe.convert_options import ConvertOptions, row, table, target_formats
from .options import add_limit_option, add_rows, check_remap_options, command, limits_of, rows_given
from .output import print_json_error


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from ..recipe.convert_options import GROUPS

    conv = command(sub, "convert", "convert a file to another format (format from each path)",
                    "Convert SRC to DST in one step (a one-off recipe): formats from the paths' extensions, "
                    "written\natomically, an existing DST refused without --overwrite.",
                    "  migrate convert model.safetensors model.bpk\n"
                    "  migrate convert ckpt.pt model.bpk --top-level-key state_dict --adapter pytorch_to_burn\n"
                    "  migrate convert ckpt.pt out/ --to burnpack   # writes out/ckpt.bpk\n"
                    "  migrate convert base/ merged/ --lora adapter/   # a LoRA adapter folded in")
    conv.add_argument("src", help="the file to read")
    conv.add_argument("dst", help="the file to write (its extension picks the format; none: burnpack, .bpk "
                      "appended); a folder (existing, or ending in '/'): DIR/<SRC's stem>.<ext>, the format from "
                      "--to (default safetensors); a folder or GGUF SRC, or a folder's options (shard size, "
                      "weights name, copy), make it a Hugging Face model folder (model.safetensors or shards + index)")
    conv.add_argument("--json", action="store_true", help="print the result (or the error) as JSON")
    conv.add_argument("--no-progress", action="store_true", help="no progress bar")
    groups = {key: conv.add_argument_group(title, description or None) for key, (title, description) in GROUPS.items()}
    add_rows(conv, table(), ConvertOptions(), groups=groups)
    add_limit_option(groups["source"])
    recipe = groups["recipe"]
    recipe.add_argument("--emit-recipe", action="store_true",
                        help="print the equivalent recipe as YAML and convert nothing; with -o FILE, convert and "
                        "write the recipe of what ran to FILE")
    recipe.add_argument("-o", "--recipe-output", metavar="FILE",
                        help="with --emit-recipe: the recipe file (written atomically after the output; refused if "
                        "it exists, unless --overwrite), its paths relative to FILE's folder")
    return conv


def _folder_target(src: str, dst: str, o: ConvertOptions) -> str:
    """`convert SRC DIR/` (an existing folder, or a path ending in '/').

    A file SRC goes to one file in DIR named after it, in the --to format (SafeTensors without
    --to): `convert ckpt.pt out/ --to burnpack` writes `out/ckpt.bpk`, `convert ckpt.pt out/`
    `out/ckpt.safetensors`. A folder SRC (a model folder, sharded or not), a GGUF file (a model
    with its config and tokenizer), or a folder option
    (--max-shard-size, --weights-name, --copy, --copy-from), makes DIR a Hugging Face model folder
    in SafeTensors (the default) or PyTorch (`--to pytorch`): `model.safetensors`, or shards and an
    index past --max-shard-size, named as save_pretrained names them; for Burn (`--to burnpack`)
    `DIR/<SRC's name>.bpk`, a burnpack holding a whole model. A folder format (`--to dcp`) writes its
    checkpoint as DIR itself. Any other DST is used as given."""
    from pathlib import Path

    from ..formats.registry import AUTO, by_extension, default_sharded, is_format, writer_class

    _check_not_a_file_name(dst)
    if is_format(o.target_format_name, folder=True):  # a DCP checkpoint is a folder: DIR is the checkpoint
        return dst.rstrip("/" + os.sep) or dst
    as_folder = dst.endswith(("/", os.sep)) or os.path.isdir(dst)
    if o.max_shard_size or o.copy or o.copy_from:
        return dst if dst.endswith(("/", os.sep)) or not os.path.isdir(dst) else dst + "/"
    if not as_folder:
        return dst
    stem = Path(src.rstrip("/" + os.sep)).stem
    # a GGUF file carries a whole model (config, tokenizer): it becomes a model folder too
    folder_source = (src.endswith(("/", os.sep)) or os.path.isdir(src) or is_format(o.source_format, llama_cpp=True)
                     or is_format(by_extension(src), llama_cpp=True))
    # a format of one file per model (Burn's) writes that file into DIR
    if is_format(o.target_format_name, shard_names=None) or not (folder_source or o.weights_name or o.copy_from):
        if o.weights_name:
            return os.path.join(dst, o.weights_name)
        # DIR's own name says nothing of the file's format: --to, else a model folder's (SafeTensors)
        fmt = default_sharded().name if o.target_format_name in (None, AUTO) else o.target_format_name
        return os.path.join(dst, stem + writer_class(fmt).default_extension)
    return dst if dst.endswith(("/", os.sep)) else dst + "/"


def _check_not_a_file_name(dst: str) -> None:
    """An existing folder named like a file of a format (`out.bpk/`) without a trailing '/' is refused:
    writing into it would make a target named like a burnpack file a folder holding another format."""
    from ..formats.registry import by_extension
    from ..recipe.convert import ConvertUsageError

    if dst.endswith(("/", os.sep)) or not os.path.isdir(dst):
        return
    fmt = by_extension(dst)
    if fmt is not None:
        raise ConvertUsageError(f"DST {dst} is an existing folder, though named like a {fmt} file: end it with '/' "
                                "to write into that folder, or give a file name that is not a folder")


def _recipe_output_check(args: argparse.Namespace, dst: str, o: ConvertOptions) -> None:
    """`-o FILE` is refused before converting what the write after it would refuse."""
    from pathlib import Path

    from ..storage.atomic import check_target

    check_target(Path(args.recipe_output), overwrite=args.overwrite, protect=[args.src], outputs=_outputs(dst, o))


def _outputs(dst: str, o: ConvertOptions) -> list[str]:
    """The files the conversion writes: DST, and Burn's optimizer record beside a .bpk DST with
    --training-state keep (`plan.outputs.record_file`)."""
    from ..formats.registry import target_is
    from ..plan.outputs import record_file

    out = [dst]
    if (o.training_state == "keep" and target_is(dst, o.target_format_name, for_burn=True)
            and not str(dst).endswith(("/", os.sep))):
        out.append(record_file(dst, o.optimizer))
    return out


def _write_recipe(args: argparse.Namespace, dst: str, o: ConvertOptions, text: str) -> str | None:
    """Write the recipe of what ran to `-o FILE` (atomically, after the output); the problem, if any."""
    from ..core.errors import MigratorError
    from ..storage.atomic import write_file

    try:
        write_file(args.recipe_output, text.encode(), overwrite=args.overwrite, protect=[args.src],
                   outputs=_outputs(dst, o), fsync=args.fsync, make_folders=True)
    except MigratorError as e:
        return str(e)
    return None


def _check_convert_values(dst: str, o: ConvertOptions, parser: argparse.ArgumentParser) -> None:
    """Values a recipe would refuse at its LINE:COL are usage errors here (exit 2, JSON with --json),
    found before any file is opened: the shard size, and a target whose format cannot be told (the
    format names themselves are checked by the parser)."""
    if o.max_shard_size is not None:
        from ..files.shard_layout import parse_size

        try:
            parse_size(o.max_shard_size)
        except ValueError as e:
            parser.error(f"{row('max_shard_size').flag}: {e}")
    from ..core.errors import UnknownFormatError
    from ..formats.registry import AUTO, target_format

    folder = o.max_shard_size is not None or str(dst).endswith(("/", os.sep))
    if not folder:
        try:
            target_format(dst, o.target_format_name)
        except UnknownFormatError as e:
            names = [n for n in target_formats() if n != AUTO]
            parser.error(f"{e.detail} ({row('target_format_name').flag} {'|'.join(names)})")


def _options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, ConvertOptions]:
    """DST as written (a folder DST/ made a file in it, `_folder_target`) and the conversion's options,
    checked as a recipe would check them: a usage error (exit 2) for what does not go together."""
    from ..formats.registry import is_format

    o = ConvertOptions(**rows_given(args, table(), parser))
    check_remap_options(list(o.remaps), parser)
    _check_convert_values(args.dst, o, parser)
    if args.recipe_output and not args.emit_recipe:
        parser.error("-o/--recipe-output FILE is where --emit-recipe writes the recipe: add --emit-recipe")
    dst = _folder_target(args.src, args.dst, o)
    flag = {r.name: r.flag for r in table()}
    if o.quantize:
        _check_quantize(o, args.dst, dst, parser)
    if o.optimizer and o.training_state != "keep":
        parser.error(f"{flag['optimizer']} PATH is where Burn's optimizer record goes: add "
                     f"{flag['training_state']} keep")
    if o.weights_name and is_format(o.target_format_name, shard_names=None) and not o.max_shard_size:
        o = replace(o, weights_name=None)  # a burnpack's name went into DST
    return dst, o


def _check_quantize(o: ConvertOptions, given: str, dst: str, parser: argparse.ArgumentParser) -> None:
    """`--quantize NAME`: a known name (one of `quantize_types`), into a target that can hold it: a
    compressed-tensors scheme into a SafeTensors folder DST/, a ggml type or mix into a GGUF DST."""
    from ..formats.registry import target_format, target_is
    from ..recipe.convert import quantize_scheme
    from ..recipe.convert_options import gguf_types, quantize_schemes, quantize_types

    flag = {r.name: r.flag for r in table()}
    name = o.quantize or ""
    scheme = quantize_scheme(name)
    if scheme is None and name not in gguf_types() and name.upper() not in gguf_types():
        from ..naming.similarity import did_you_mean

        guess = did_you_mean(name, list(quantize_types()))
        parser.error(f"{flag['quantize']}: unknown type '{name}' ({f'did you mean {guess!r}? ' if guess else ''}"
                     f"choose from {', '.join(quantize_types())})")
    gguf = target_is(dst, o.target_format_name, llama_cpp=True)
    if scheme is None:
        if not gguf:
            parser.error(f"{flag['quantize']} {name} is a ggml type: it applies to GGUF targets (DST ending in .gguf, "
                         f"or {flag['target_format_name']} gguf); a SafeTensors folder takes "
                         f"{' or '.join(quantize_schemes())}")
        return
    folder = str(dst).endswith(("/", os.sep))
    fmt = "gguf" if gguf else target_format(dst, o.target_format_name, sharded=folder)
    from ..formats.compressed_tensors_schemes import can_hold

    if can_hold(fmt, folder):
        return
    if str(given).endswith(("/", os.sep)) and not folder:  # a file SRC into DIR/: a file in DIR, no config.json
        why = (f"DST {given} takes a file for a file SRC: add {flag['copy_from']} DIR, the model folder whose "
               "config.json goes with it")
    else:
        what = f"a folder of {fmt} shards" if folder else f"a {fmt} file"
        why = f"DST is {what}: give a SafeTensors folder DST/"
    parser.error(f"{flag['quantize']} {scheme} writes compressed-tensors' layout, a SafeTensors model folder with its "
                 f"config.json; {why}")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..recipe.convert import ConvertUsageError, build_recipe, emit_recipe
    from ..run.convert import convert

    try:
        dst, o = _options(args, parser)
    except ConvertUsageError as e:
        return _usage_error(args, e)
    recipe_text = None
    try:
        if args.emit_recipe:  # alone: print the recipe, convert nothing; with -o FILE: convert, record it there
            recipe = build_recipe(args.src, dst, o)
            from pathlib import Path

            from ..plan.build import renumbers_by_default

            if renumbers_by_default(recipe, Path(os.getcwd()), **limits_of(args)):  # write out what the default does
                o = replace(o, contiguous_indices=True)
                recipe = build_recipe(args.src, dst, o)
            recipe_text = emit_recipe(recipe, args.recipe_output)
            if not args.recipe_output:
                sys.stdout.write(recipe_text)
                return EXIT_OK
            _recipe_output_check(args, dst, o)
        import hashlib

        sha = hashlib.sha256(recipe_text.encode()).hexdigest() if recipe_text else None
        result = convert(args.src, dst, o, progress=False if args.no_progress else None, recipe_sha256=sha,
                         **limits_of(args))
    except ConvertUsageError as e:  # an option the recipe model refuses, in the recipe's words
        return _usage_error(args, e)
    problem = _write_recipe(args, dst, o, recipe_text) if recipe_text is not None else None
    from ..core.display import count, escape, human_bytes
    from .output import print_written

    headline = (f"wrote {escape(result.target)} ({result.target_format}): {count(result.tensors, 'tensor')}, "
                f"{human_bytes(result.nbytes)} from {escape(result.source)} ({result.source_format})")
    return print_written(result, as_json=args.json, headline=headline, recipe_output=args.recipe_output,
                         recipe_written=recipe_text is not None, problem=problem, what="conversion")


def _usage_error(args: argparse.Namespace, e: Exception) -> int:
    if args.json:
        print_json_error({"kind": "UsageError", "message": str(e)})
    else:
        from ..core.display import escape

        print(f"migrate convert: {escape(e, keep_newlines=True)}", file=sys.stderr)
    return EXIT_USAGE

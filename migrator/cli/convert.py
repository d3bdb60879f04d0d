"""`migrate convert SRC DST`: a one-off conversion (`run/convert.py`), its options checked as a
recipe would check them; `--emit-recipe` writes the recipe of what ran."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..core.errors import EXIT_OK, EXIT_USAGE
from ..formats.registry import choices
from .options import NO_FSYNC_HELP, add_limit_option, check_remap_options, command, limits_of
from .output import print_json_error


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from ..recipe import adapter_names

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
    conv.add_argument("--overwrite", action="store_true", help="replace an existing target")
    conv.add_argument("--no-fsync", action="store_true", help=NO_FSYNC_HELP)
    conv.add_argument("--from", dest="source_format", default="auto",
                      help=f"source format: {' | '.join(choices(readable=True))} (default: detect)")
    conv.add_argument("--to", dest="target_format", default="auto",
                      help=f"target format: {' | '.join(choices(writable=True))} (default: extension)")
    conv.add_argument("--top-level-key", help="the nested dict (PyTorch) or name prefix holding the tensors; "
                      "a DeepSpeed ZeRO folder: 'module' for the module's own weights instead of the fp32 masters")
    conv.add_argument("--tag", help="a DeepSpeed ZeRO checkpoint folder: the step to read (e.g. global_step10; "
                      "default: the one its 'latest' file names)")
    conv.add_argument("--param-order", metavar="FILE", default=None,
                      help="a Hugging Face Trainer checkpoint folder with --training-state keep: a state dict of the "
                      "model whose names, in stored order, give its parameters' order (optimizer.pt saves no names; "
                      "default: derived with transformers from config.json)")
    conv.add_argument("--training-state", choices=("keep", "drop"), default=None,
                      help="a training checkpoint's optimizer state: keep (rewritten to follow every rename, split "
                      "and permute; into a .pt target, or into a .bpk target as Burn's optimizer record beside the "
                      "model) or drop (default: keep for a whole .pt -> .pt run, drop when a top level key selects "
                      "the model)")
    conv.add_argument("--optimizer-out", metavar="PATH", default=None,
                      help="with --training-state keep into a .bpk: where Burn's optimizer record is written "
                      "(default: beside DST, <stem>-optim.bpk)")
    conv.add_argument("--remap", action="append", default=[], metavar="REGEX=REPL", help="rename (repeatable, ordered)")
    conv.add_argument("--include", action="append", default=[], metavar="REGEX", help="keep only matching names")
    conv.add_argument("--exclude", action="append", default=[], metavar="REGEX", help="drop matching names")
    conv.add_argument("--adapter", action="append", default=[], metavar="NAME",
                      help=" | ".join(adapter_names.CLI_FORMS) + " (repeatable, chained in order)")
    conv.add_argument("--modules", action="append", default=[], metavar="TYPE=REGEX",
                      help="declare the module type of matching module paths, as a recipe's modules: "
                           "(repeatable; e.g. Linear='^fc\\d+$')")
    conv.add_argument("--dtype", metavar="DTYPE", help="cast every float tensor (F64, F32, Flex32, F16, BF16)")
    conv.add_argument("--quantize", metavar="TYPE",
                      help="GGUF target: write 2-D float tensors as TYPE (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, "
                      "F16, BF16, F32), or as llama.cpp's mix (Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q3_K_S/M/L, Q2_K: "
                      "llama-quantize's type per tensor); 1-D tensors and norms stay F32 (a recipe's "
                      "target.quantize picks per tensor)")
    conv.add_argument("--lora", metavar="ADAPTER",
                      help="fold this PEFT LoRA adapter folder into SRC (PEFT's merge_and_unload, streamed); with "
                           "DST/ the base's config.json, generation and tokenizer files are carried over")
    conv.add_argument("--lora-scale", type=float, metavar="S",
                      help="with --lora: multiply the adapter's scaling (lora_alpha / r) by S (default 1)")
    conv.add_argument("--contiguous-indices", action=argparse.BooleanOptionalAction, default=None,
                      help="renumber index segments 0,1,2,... (default: on for a PyTorch source written for Burn, "
                           "i.e. a .bpk target or --adapter pytorch_to_burn; the no- form keeps the names)")
    conv.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                      help="add a metadata entry (repeatable)")
    conv.add_argument("--no-metadata", action="store_true", help="write no metadata except --metadata entries")
    conv.add_argument("--max-shard-size", metavar="SIZE",
                      help="write DST as a folder of shards of at most SIZE (5GB = 5*10^9 bytes, 5GiB = 5*2^30, "
                      "an integer = bytes) plus an index; a DST/ without it is a Hugging Face folder of 5GB "
                      "shards (one model.safetensors when the model fits)")
    conv.add_argument("--weights-name", metavar="NAME",
                      help="the weights' file name in a folder DST/ (default: model.safetensors or "
                           "pytorch_model.bin, adapter_model.* for a PEFT adapter; shards are NAME's stem "
                           "-00001-of-0000N)")
    conv.add_argument("--copy", action="append", default=[], metavar="GLOB",
                      help="copy matching companion files (config.json, 'tokenizer*') from the source folder into a "
                      "sharded DST (repeatable)")
    conv.add_argument("--copy-from", metavar="DIR",
                      help="the folder --copy globs read from (default: the source's folder), e.g. the Hugging "
                           "Face folder whose config.json and tokenizer go with a .bpk source; alone, its usual "
                           "companions (config, generation config, tokenizer files, chat template) when present")
    conv.add_argument("--emit-recipe", action="store_true",
                      help="print the equivalent recipe as YAML and convert nothing; with -o FILE, convert and "
                      "write the recipe of what ran to FILE")
    conv.add_argument("-o", "--recipe-output", metavar="FILE",
                      help="with --emit-recipe: the recipe file (written atomically after the output; refused if it "
                      "exists, unless --overwrite), its paths relative to FILE's folder")
    conv.add_argument("--json", action="store_true", help="print the result (or the error) as JSON")
    conv.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_limit_option(conv)
    return conv


def _folder_target(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """`convert SRC DIR/` (an existing folder, or a path ending in '/').

    A file SRC goes to one file in DIR named after it, in the --to format (SafeTensors without
    --to): `convert ckpt.pt out/ --to burnpack` writes `out/ckpt.bpk`, `convert ckpt.pt out/`
    `out/ckpt.safetensors`. A folder SRC (a model folder, sharded or not), a GGUF file (a model
    with its config and tokenizer), or a folder option
    (--max-shard-size, --weights-name, --copy, --copy-from), makes DIR a Hugging Face model folder
    in SafeTensors (the default) or PyTorch (`--to pytorch`): `model.safetensors`, or shards and an
    index past --max-shard-size, named as save_pretrained names them; for Burn (`--to burnpack`)
    `DIR/<SRC's name>.bpk`, a burnpack holding a whole model. Any other DST is used as given."""
    from pathlib import Path

    from ..formats.registry import AUTO, by_extension, default_sharded, is_format, writer_class

    dst: str = args.dst
    _check_not_a_file_name(dst)
    as_folder = dst.endswith(("/", os.sep)) or os.path.isdir(dst)
    if args.max_shard_size or args.copy or args.copy_from:
        return dst if dst.endswith(("/", os.sep)) or not os.path.isdir(dst) else dst + "/"
    if not as_folder:
        return dst
    src: str = args.src
    stem = Path(src.rstrip("/" + os.sep)).stem
    # a GGUF file carries a whole model (config, tokenizer): it becomes a model folder too
    folder_source = (src.endswith(("/", os.sep)) or os.path.isdir(src) or is_format(args.source_format, llama_cpp=True)
                     or is_format(by_extension(src), llama_cpp=True))
    # a format of one file per model (Burn's) writes that file into DIR
    if is_format(args.target_format, shard_names=None) or not (folder_source or args.weights_name or args.copy_from):
        if args.weights_name:
            return os.path.join(dst, args.weights_name)
        # DIR's own name says nothing of the file's format: --to, else a model folder's (SafeTensors)
        fmt = default_sharded().name if args.target_format in (None, AUTO) else args.target_format
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


def _recipe_output_check(args: argparse.Namespace) -> None:
    """`-o FILE` is refused before converting what the write after it would refuse."""
    from pathlib import Path

    from ..storage.atomic import check_target

    check_target(Path(args.recipe_output), overwrite=args.overwrite, protect=[args.src], outputs=_outputs(args))


def _outputs(args: argparse.Namespace) -> list[str]:
    """The files the conversion writes: DST, and Burn's optimizer record beside a .bpk DST with
    --training-state keep (`plan.outputs.record_file`)."""
    from ..formats.registry import target_is
    from ..plan.outputs import record_file

    out = [args.dst]
    if (args.training_state == "keep" and target_is(args.dst, args.target_format, for_burn=True)
            and not str(args.dst).endswith(("/", os.sep))):
        out.append(record_file(args.dst, args.optimizer_out))
    return out


def _write_recipe(args: argparse.Namespace, text: str) -> str | None:
    """Write the recipe of what ran to `-o FILE` (atomically, after the output); the problem, if any."""
    from ..core.errors import MigratorError
    from ..storage.atomic import write_file

    try:
        write_file(args.recipe_output, text.encode(), overwrite=args.overwrite, protect=[args.src],
                   outputs=_outputs(args), fsync=not args.no_fsync, make_folders=True)
    except MigratorError as e:
        return str(e)
    return None


def _check_convert_values(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Values a recipe would refuse at its LINE:COL are usage errors here (exit 2, JSON with --json),
    found before any file is opened: the shard size, and a target whose format cannot be told."""
    if args.max_shard_size is not None:
        from ..files.shard_layout import parse_size

        try:
            parse_size(args.max_shard_size)
        except ValueError as e:
            parser.error(f"--max-shard-size: {e}")
    from ..core.errors import UnknownFormatError
    from ..formats.registry import target_format

    for option, value, known in (("--from", args.source_format, choices(readable=True)),
                                 ("--to", args.target_format, choices(writable=True))):
        if value not in known:
            parser.error(f"{option}: unknown format '{value}' (formats: {', '.join(known[1:])})")
    folder = args.max_shard_size is not None or str(args.dst).endswith(("/", os.sep))
    if not folder:
        try:
            target_format(args.dst, args.target_format)
        except UnknownFormatError as e:
            parser.error(f"{e.detail} (--to {'|'.join(choices(writable=True)[1:])})")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..recipe.convert import ConvertUsageError, build_recipe, emit_recipe
    from ..run.convert import convert

    extra: dict[str, str] = {}
    for item in args.metadata:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--metadata expects KEY=VALUE, got {item!r}")
        extra[key] = value
    check_remap_options(args.remap, parser)
    _check_convert_values(args, parser)
    if args.recipe_output and not args.emit_recipe:
        parser.error("-o/--recipe-output FILE is where --emit-recipe writes the recipe: add --emit-recipe")
    try:
        args.dst = _folder_target(args, parser)
    except ConvertUsageError as e:
        return _usage_error(args, e)
    options = dict(source_format=args.source_format, target_format_name=args.target_format,
                   top_level_key=args.top_level_key, tag=args.tag, param_order=args.param_order,
                   training_state=args.training_state,
                   remaps=args.remap, includes=args.include,
                   excludes=args.exclude,
                   adapters=args.adapter, dtype=args.dtype, modules=args.modules,
                   contiguous_indices=args.contiguous_indices, lora=args.lora, lora_scale=args.lora_scale,
                   overwrite=args.overwrite, fsync=not args.no_fsync, metadata=extra, clear_metadata=args.no_metadata)
    if args.max_shard_size or args.copy:  # only when given: options a plain copy takes stay as they were
        options.update(max_shard_size=args.max_shard_size, copy=args.copy)
    if args.quantize:
        from ..formats.registry import target_is

        if not target_is(args.dst, args.target_format, llama_cpp=True):
            parser.error("--quantize applies to GGUF targets (DST ending in .gguf, or --to gguf)")
        options.update(quantize=args.quantize)
    if args.optimizer_out:
        if args.training_state != "keep":
            parser.error("--optimizer-out PATH is where Burn's optimizer record goes: add --training-state keep")
        options.update(optimizer=args.optimizer_out)
    if args.copy_from:  # alone, the usual companions are copied (build_recipe)
        options.update(copy_from=args.copy_from)
    from ..formats.registry import is_format

    if args.weights_name and not (is_format(args.target_format, shard_names=None) and not args.max_shard_size):
        options.update(weights_name=args.weights_name)  # a folder's weights; a burnpack's name went into DST
    recipe_text = None
    try:
        if args.emit_recipe:  # alone: print the recipe, convert nothing; with -o FILE: convert, record it there
            recipe = build_recipe(args.src, args.dst, **options)
            from pathlib import Path

            from ..plan.build import renumbers_by_default

            if renumbers_by_default(recipe, Path(os.getcwd()), **limits_of(args)):  # write out what the default does
                options["contiguous_indices"] = True
                recipe = build_recipe(args.src, args.dst, **options)
            recipe_text = emit_recipe(recipe, args.recipe_output)
            if not args.recipe_output:
                sys.stdout.write(recipe_text)
                return EXIT_OK
            _recipe_output_check(args)
        import hashlib

        sha = hashlib.sha256(recipe_text.encode()).hexdigest() if recipe_text else None
        result = convert(args.src, args.dst, progress=False if args.no_progress else None, recipe_sha256=sha,
                         **options, **limits_of(args))
    except ConvertUsageError as e:  # an option the recipe model refuses, in the recipe's words
        return _usage_error(args, e)
    problem = _write_recipe(args, recipe_text) if recipe_text is not None else None
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

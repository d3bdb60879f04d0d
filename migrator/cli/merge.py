"""`migrate merge CONFIG OUT/`: a mergekit config run into a Hugging Face folder (`run/merge.py`).

Exit 0 when written, 1 for a data error (models whose tensors disagree, a bad adapter), 2 for a
usage error or a config mergekit would refuse or migrator does not support (FILE:LINE:COL).
Imported by `migrate --help`: only argparse at module level.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..core.errors import EXIT_OK


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from ..run.merge_options import MergeOptions, table
    from .options import add_limit_option, add_rows, command

    p = command(sub, "merge", "run a mergekit config: merged weights, streamed, as a Hugging Face folder",
                "Run a mergekit YAML (linear, task_arithmetic, slerp, ties, dare_ties, dare_linear, "
                "passthrough;\nmodels as local folders or URLs, model: PATH+ADAPTER folds a LoRA first) into "
                "the folder OUT:\nSafeTensors shards plus index, the reference model's config.json "
                "(num_hidden_layers after\nslices, the dtype), generation and tokenizer files, and the config "
                "as mergekit_config.yml.\nEach output tensor is computed band by band from the matching input "
                "tensors (docs/merging.md).\nExit 0 written, 1 data error, 2 usage or config error.",
                "  migrate merge mergekit_config.yml merged/\n"
                "  migrate merge dare.yml merged/ --seed 7 --dtype BF16 --max-shard-size 2GB\n"
                "  migrate merge slerp.yml merged/ --emit-recipe -o slerp-recipe.yaml")
    p.add_argument("config", help="the mergekit YAML file")
    p.add_argument("out", help="the folder to write (refused if it exists, unless --overwrite)")
    add_rows(p, table("merge"), MergeOptions())
    p.add_argument("--emit-recipe", action="store_true",
                   help="print the equivalent recipe as YAML and merge nothing; with -o FILE, merge and write the "
                        "recipe of what ran to FILE")
    p.add_argument("-o", "--recipe-output", metavar="FILE", help="with --emit-recipe: the recipe file (its paths "
                   "relative to FILE's folder)")
    add_rows(p, table("output"), MergeOptions())
    p.add_argument("--json", action="store_true", help="print the result (or the error) as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_limit_option(p)
    return p


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..files.sharded_writer import parse_size
    from ..run.merge import emitted_recipe, merge
    from ..run.merge_options import MergeOptions, table
    from .options import limits_of, rows_given

    options = MergeOptions(**rows_given(args, table(), parser))
    try:
        parse_size(options.max_shard_size)
    except ValueError as e:
        parser.error(f"--max-shard-size: {e}")
    if args.recipe_output and not args.emit_recipe:
        parser.error("-o/--recipe-output FILE is where --emit-recipe writes the recipe: add --emit-recipe")
    out = args.out if args.out.endswith(("/", os.sep)) else args.out + "/"
    recipe_text = None
    if args.emit_recipe:
        recipe_text = emitted_recipe(args.config, out, args.recipe_output, options)
        if not args.recipe_output:
            sys.stdout.write(recipe_text)
            return EXIT_OK
        from pathlib import Path

        from ..storage.atomic import check_target

        check_target(Path(args.recipe_output), overwrite=options.overwrite, protect=[args.config], outputs=[out])
    import hashlib

    sha = hashlib.sha256(recipe_text.encode()).hexdigest() if recipe_text else None
    result = merge(args.config, out, options, progress=False if args.no_progress else None, recipe_sha256=sha,
                   **limits_of(args))
    problem = None
    if recipe_text is not None:
        from ..core.errors import MigratorError
        from ..storage.atomic import write_file

        try:
            write_file(args.recipe_output, recipe_text.encode(), overwrite=options.overwrite, protect=[args.config],
                       outputs=[out], fsync=options.fsync, make_folders=True)
        except MigratorError as e:
            problem = str(e)
    from ..core.display import count, escape, human_bytes
    from .output import print_written

    headline = (f"wrote {escape(result.target)}: {count(result.tensors, 'tensor')}, {human_bytes(result.nbytes)} "
                f"merged by {escape(args.config)}")
    return print_written(result, as_json=args.json, headline=headline, recipe_output=args.recipe_output,
                         recipe_written=recipe_text is not None, problem=problem, what="merge")

"""`migrate inspect FILE`: a file's tensors, metadata and scalars (`--stats`: values too), as a
table, JSON or an HTML page."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..core.errors import EXIT_OK
from ..formats.registry import listed, specs
from ..recipe.convert_options import ConvertOptions, row
from .options import LIMIT_HELP, add_rows, command, count, limits_of, reader_options
from .output import write_inspect_json


def add_parser(sub: Any) -> argparse.ArgumentParser:
    ins = command(sub, "inspect", "list the tensors, metadata and scalars of a file",
                   "List a file's tensors (name, dtype, shape, size, offset in data order), its metadata and "
                   "scalars.\nReads headers only. Names from the file are shown literally, unprintable "
                   "characters escaped (\\x1b); --json keeps the exact strings.",
                   "  migrate inspect model.safetensors --rows 20\n"
                   "  migrate inspect ckpt.pt --top-level-key state_dict --json\n"
                   "  migrate inspect model.bpk --stats")
    ins.add_argument("file", help=f"a {listed([s.title for s in specs() if not s.folder])} file, a model folder, or "
                     f"a {listed([s.title for s in specs() if s.folder])} folder")
    ins.add_argument("--json", action="store_true", help="print a JSON object instead of tables")
    # how FILE is read: convert's options for SRC, from its table (`--format` is the old spelling of --from)
    add_rows(ins, [row("source_format"), row("top_level_key"), row("tag")], ConvertOptions(),
             old={"source_format": ("--format",)}, text=lambda h: h.replace("SRC", "FILE"))
    ins.add_argument("--rows", type=count, metavar="N", help="show at most N tensors (and shards) in the table")
    # `--limit N` was --rows N: a reader limit is always NAME=VALUE, so both still parse (docs/commands.md)
    ins.add_argument("--limit", dest="limit_args", action="append", default=[], metavar="NAME=VALUE",
                     help=LIMIT_HELP)
    ins.add_argument("--stats", action="store_true", help="read every tensor (streamed): min, max, mean, std, "
                     "mean |x|, zeros, NaN/Inf; flags all-zero, all-equal, NaN/Inf tensors")
    ins.add_argument("--html", metavar="FILE", help="write the listing as a self-contained HTML page instead of "
                     "the table")
    ins.add_argument("--overwrite", action="store_true", help="replace an existing HTML page")
    return ins


def run(args: argparse.Namespace) -> int:
    from ..analysis.inspect import inspect_file

    if args.stats:
        from ..analysis.stats import inspect_with_stats

        info = inspect_with_stats(args.file, format=args.source_format, **reader_options(args), **limits_of(args))
    else:
        info = inspect_file(args.file, format=args.source_format, **reader_options(args), **limits_of(args))
    if args.html:
        from ..analysis.html_report import inspect_page, write_page

        write_page(args.html, inspect_page(info), overwrite=args.overwrite, protect=[args.file], make_folders=True)
    if args.json:
        write_inspect_json(info, sys.stdout)
        return EXIT_OK
    if args.html:
        from ..core.display import escape

        print(f"wrote {escape(args.html)}")
        return EXIT_OK
    _print_inspect(info, args.rows)
    return EXIT_OK


def _print_inspect(info: dict[str, Any], limit: int | None) -> None:
    from ..core.display import count, human_bytes, print_table

    tensors = info["tensors"]
    with_ids = any("param_id" in t for t in tensors)
    sharded = any("file" in t for t in tensors)
    ggml = any("ggml_type" in t for t in tensors)  # GGUF: the stored type beside the dtype read
    header = (["name", "dtype"] + (["ggml type"] if ggml else []) + ["shape", "size", "offset"]
              + (["param_id"] if with_ids else []) + (["shard"] if sharded else []))
    with_stats = bool(tensors) and "stats" in tensors[0]
    if with_stats:
        from ..analysis.stats import STATS_HEADER, stats_cells

        header += STATS_HEADER
    shown = tensors if limit is None else tensors[:limit]
    sizes: dict[int, str] = {}
    rows = []
    for t in shown:
        nbytes = t.get("stored_nbytes", t["nbytes"])  # a GGUF's quantized tensor: its blocks, not as read
        size = sizes.get(nbytes) or sizes.setdefault(nbytes, human_bytes(nbytes))
        row = [t["name"], t["dtype"], *([t.get("ggml_type", "")] if ggml else []), str(t["shape"]), size,
               "-" if t["offset"] is None else str(t["offset"])]
        if with_ids:
            row.append(str(t.get("param_id", "")))
        if sharded:
            row.append(os.path.basename(t.get("file", "")))
        if with_stats:
            row += stats_cells(t)
        rows.append(row)
    title = f"{info['path']} ({info['format']}, {human_bytes(info['file_size'])})"
    right: tuple[int, ...] = (3, 4, 5) if with_ids else (3, 4)
    if ggml:
        right = tuple(i + 1 for i in right)
    if with_stats:  # the numeric stats columns, not the flags
        right += tuple(range(len(header) - len(STATS_HEADER), len(header) - 1))
    print_table(title, header, rows, right=right)
    out = sys.stdout
    if len(shown) < len(tensors):
        out.write(f"... and {count(len(tensors) - len(shown), 'more tensor')} (use --rows N or --json)\n")
    totals = info["totals"]
    if "stored_nbytes" in totals and totals["stored_nbytes"] != totals["nbytes"]:
        out.write(f"{count(totals['tensors'], 'tensor')}, {human_bytes(totals['stored_nbytes'])} as stored "
                  f"({human_bytes(totals['nbytes'])} dequantized, in the dtype read)\n")
    else:
        out.write(f"{count(totals['tensors'], 'tensor')}, {human_bytes(totals['nbytes'])}\n")
    for flag, n in totals.get("flagged", {}).items():
        out.write(f"flagged {flag.replace('_', ' ')}: {count(n, 'tensor')}\n")
    _print_shards(info, limit)
    _print_quantization(info)
    for note in info["details"].get("notes", ()):  # what the source holds beside the tensors listed
        out.write(f"note: {note}\n")
    for warning in info["details"].get("warnings", ()):  # ASCII (names in them are ascii()-escaped)
        print(f"warning: {warning}", file=sys.stderr)
    pair = info.get("pair")  # a model and its Burn optimizer record: written together, or not
    if pair:
        from ..core.display import escape

        if pair["status"] == "paired":
            out.write(f"note: {escape(pair['message'])}\n")
        else:
            print(f"warning: {escape(pair['message'])}", file=sys.stderr)
    for title, mapping in (("metadata", info["metadata"]), ("scalars", info["scalars"])):
        if mapping:
            pairs = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in mapping.items()]
            out.write("\n")
            print_table(title, ("key", "value"), pairs, wrap_cols=(0, 1))
    placeholders = info["details"].get("placeholders")
    if placeholders:  # objects of classes migrator does not build (a checkpoint's args, configs, callbacks)
        out.write("\n")
        print_table("objects not built (placeholders)", ("key", "class"),
                    [(p["key"] or "(root)", p["class"]) for p in placeholders], wrap_cols=(0, 1))


def _print_quantization(info: dict[str, Any]) -> None:
    """A quantized model folder's scheme (from its config.json), and its weights' sizes stored and
    dequantized."""
    from ..core.display import count, escape, human_bytes

    q = info.get("details", {}).get("quantization")
    if not q:
        return
    out = sys.stdout
    out.write(f"\nquantization: {escape(q['description'])}, declared by {escape(q['config'])}\n")
    by_size: dict[int, list[str]] = {}
    for dtype, n in q["dequantized_bytes"].items():
        by_size.setdefault(n, []).append(dtype)
    sizes = ", ".join(f"{human_bytes(n)} as {'/'.join(names)}" for n, names in by_size.items())
    out.write(f"  {count(q['weights'], 'quantized weight')} and {count(q['consumed'], 'tensor')} they consume "
              f"(scales): {human_bytes(q['stored_bytes'])} stored; dequantized: {sizes}\n")
    if q["skipped_modules"]:
        out.write(f"  left unquantized: {escape(', '.join(q['skipped_modules']))}\n")
    if q["dequantized_to"] is None:
        out.write("  convert --dtype BF16|F16|F32 dequantizes them\n")


def _print_shards(info: dict[str, Any], limit: int | None = None) -> None:
    """A sharded source's per-shard summary: file, tensors, tensor bytes, file size; the first
    `limit` shards when --rows N is given (as for tensors)."""
    from ..core.display import count, human_bytes, print_table

    shards = info.get("details", {}).get("shards")
    if not shards:
        return
    index = info["details"].get("index")
    shown = shards if limit is None else shards[:limit]
    rows = [(os.path.basename(s["file"]), str(s["tensors"]), human_bytes(s["nbytes"]), human_bytes(s["file_size"]))
            for s in shown]
    sys.stdout.write("\n")
    print_table(count(len(shards), "shard") + (f" (index {index})" if index else ""),
                ("shard", "tensors", "size", "file size"), rows, right=(1, 2, 3))
    if len(shown) < len(shards):
        sys.stdout.write(f"... and {count(len(shards) - len(shown), 'more shard')} (use --rows N or --json)\n")

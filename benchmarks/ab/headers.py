"""A/B of the SafeTensors and burnpack header readers: user-visible commands, alternating runs.

Usage: python benchmarks/ab/headers.py [--rounds N] [--commands inspect,plan,convert] DIR

Writes a DeepSeek-V3-shaped model (61 layers, 58 of them MoE with 256 experts: ~90k tensors named
`model.layers.N.mlp.experts.M.gate_proj.weight`, with `weight_scale_inv` beside each projection) as
SafeTensors and burnpack into DIR (small shapes: ~0.3 GB each), then times `migrate inspect --json`,
`migrate plan` of a rename recipe and `migrate convert` of each file in fresh processes, with each
variant given by `--variant` below: "default" (the reader as it is) or any other variant a reader
defines (e.g. the fast path switched off, when there is one). Variants alternate run by run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Run inside the child: apply the variant, then the CLI. Only what a variant needs is touched.
CHILD = """
import sys
variant = sys.argv[1]
if variant in ("fast", "full"):
    import migrator.formats.safetensors as st, migrator.formats.burnpack as bp
    for cls in (st.SafetensorsReader, bp.BurnpackReader):
        setattr(cls, "fast_path", variant == "fast")
from migrator.cli import main
sys.exit(main(sys.argv[2:]))
"""


def deepseek_shapes() -> Iterator[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) in DeepSeek-V3's naming, with small shapes of realistic rank."""
    yield "model.embed_tokens.weight", "BF16", (129, 72)
    for layer in range(61):
        p = f"model.layers.{layer}."
        yield p + "input_layernorm.weight", "BF16", (72,)
        yield p + "post_attention_layernorm.weight", "BF16", (72,)
        for proj in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            yield p + f"self_attn.{proj}.weight", "BF16", (48, 72)
            yield p + f"self_attn.{proj}.weight_scale_inv", "F32", (1, 1)
        yield p + "self_attn.q_a_layernorm.weight", "BF16", (48,)
        yield p + "self_attn.kv_a_layernorm.weight", "BF16", (48,)
        if layer < 3:
            experts = [p + "mlp."]
        else:
            yield p + "mlp.gate.weight", "BF16", (256, 72)
            yield p + "mlp.gate.e_score_correction_bias", "F32", (256,)
            experts = [p + f"mlp.experts.{e}." for e in range(256)] + [p + "mlp.shared_experts."]
        for e in experts:
            for proj, shape in (("gate_proj", (24, 72)), ("up_proj", (24, 72)), ("down_proj", (72, 24))):
                yield e + f"{proj}.weight", "BF16", shape
                yield e + f"{proj}.weight_scale_inv", "F32", (1, 1)
    yield "model.norm.weight", "BF16", (72,)
    yield "lm_head.weight", "BF16", (129, 72)


def make_models(folder: Path) -> tuple[Path, Path]:
    """The model as `deepseek.safetensors` and `deepseek.bpk` (made once; zero bytes as data)."""
    from migrator.core import dtypes
    from migrator.core.tensor import LazyTensor
    from migrator.formats.burnpack import BurnpackWriter
    from migrator.formats.safetensors import SafetensorsWriter
    from migrator.storage.atomic import atomic_output

    st, bpk = folder / "deepseek.safetensors", folder / "deepseek.bpk"
    if st.exists() and bpk.exists():
        return st, bpk
    tensors = []
    for name, dt, shape in deepseek_shapes():
        dtype = dtypes.BY_SAFETENSORS[dt]
        n = dtype.nbytes(shape)
        tensors.append(LazyTensor(name, dtype, shape, n, lambda n=n: memoryview(bytes(n))))
    meta = {"format": "pt"}
    for path, writer in ((st, SafetensorsWriter(tensors, metadata=meta, order="given")),
                         (bpk, BurnpackWriter(tensors, metadata=meta))):
        with atomic_output(path, expected_size=writer.total_size, fsync=False) as sink:
            writer.write_to(sink)
    return st, bpk


def commands(st: Path, bpk: Path, folder: Path, wanted: set[str]) -> Iterator[tuple[str, list[str]]]:
    for label, path, ext in (("SafeTensors", st, "bpk"), ("burnpack", bpk, "safetensors")):
        recipe = folder / f"plan-{path.suffix[1:]}.yaml"
        recipe.write_text(f"version: 1\nsource:\n  path: {path}\nremap:\n  - from: '^model\\.'\n    to: ''\n"
                          f"target:\n  path: {folder / ('planned.' + ext)}\n")
        if "inspect" in wanted:
            yield f"inspect --json, {label}", ["inspect", "--json", str(path)]
        if "plan" in wanted:
            yield f"plan (rename), {label}", ["plan", str(recipe)]
        if "convert" in wanted:
            yield f"convert -> {ext}, {label}", ["convert", str(path), str(folder / f"out.{ext}"), "--overwrite",
                                                  "--no-fsync"]


TREES: dict[str, str] = {}  # variant -> the package tree it runs (default: this checkout)


def run(variant: str, args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": TREES.get(variant, str(REPO))}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD, variant, *args], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="fast,full", help="comma-separated, e.g. fast,full or default")
    ap.add_argument("--commands", default="inspect,plan,convert")
    ap.add_argument("--formats", default="safetensors,burnpack")
    ap.add_argument("--tree", action="append", default=[], metavar="VARIANT=PATH",
                    help="run VARIANT (as 'default') from another checkout's package, e.g. old=/tmp/old")
    a = ap.parse_args()
    for spec in a.tree:
        name, _, path = spec.partition("=")
        TREES[name] = path
    a.folder.mkdir(parents=True, exist_ok=True)
    st, bpk = make_models(a.folder)
    variants = a.variants.split(",")
    print(f"{len(list(deepseek_shapes()))} tensors; SafeTensors {st.stat().st_size >> 20} MiB, "
          f"burnpack {bpk.stat().st_size >> 20} MiB; {a.rounds} alternating rounds, wall seconds (median, min)")
    formats = set(a.formats.split(","))
    for label, args in commands(st, bpk, a.folder, set(a.commands.split(","))):
        if ("SafeTensors" in label.split(", ")[-1]) != ("safetensors" in formats) and len(formats) == 1:
            continue
        times: dict[str, list[float]] = {v: [] for v in variants}
        run(variants[0], args)  # warm the page cache
        for r in range(a.rounds):
            for v in variants if r % 2 == 0 else variants[::-1]:
                times[v].append(run(v, args))
        cells = "  ".join(f"{v} {statistics.median(t):.2f} ({min(t):.2f})" for v, t in times.items())
        medians = [statistics.median(times[v]) for v in variants]
        ratio = f"  {variants[0]}/{variants[1]} {medians[0] / medians[1]:.2f}" if len(variants) == 2 else ""
        print(f"{label:34} {cells}{ratio}", flush=True)


if __name__ == "__main__":
    main()

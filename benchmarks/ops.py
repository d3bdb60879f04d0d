"""Recipe ops at model scale: wall time and peak RSS against the bound (largest input tensor + 150 MiB).

    PYTHONPATH=$PWD python benchmarks/ops.py [WORKDIR] [--rounds 2] [--scale 1.0]

Models (generated tensor by tensor into WORKDIR, default benchmarks/out/ops; deleted at the end):
- GPT-2-XL-shaped fused attention: 48 layers of `attn.c_attn.weight` [1600, 4800] F32 (30.7 MB each,
  1.47 GB in all) and its bias, HF GPT2LMHeadModel names;
- a Mixtral-shaped MoE layer: 8 experts x (w1, w3 [7168, 4096], w2 [4096, 7168]) BF16, 58.7 MB each
  (1.41 GB), per-expert names.
Jobs, each its own `migrate run` process of a checked-in recipe with --source/--target, durable
(fsync), timed by harness.run (sync before and after, warm input, GNU time for peak RSS), rounds
rotated: gpt2-split-qkv (split dim 1 + transpose), gpt2-merge-qkv (concat dim 0 + transpose),
mixtral-stack-experts (stack x3 + concat dim 1), mixtral-unstack-experts (unstack + split), and
`cp` + sync of each source for scale. `--scale` shrinks every tensor's first dim (quick looks).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import harness  # noqa: E402

from migrator import save  # noqa: E402
from migrator.core import dtypes  # noqa: E402
from migrator.core.tensor import LazyTensor  # noqa: E402

BOUND_EXTRA = 150 << 20


def _random(shape: tuple[int, ...], dtype: str, seed: int) -> LazyTensor:
    """A tensor whose bytes are made when written (one tensor in memory at a time)."""
    import numpy as np

    dt = dtypes.parse(dtype)
    nbytes = dt.nbytes(shape)
    assert nbytes is not None

    def load() -> memoryview:
        rng = np.random.default_rng(seed)
        if dtype == "F32":
            return memoryview(rng.standard_normal(shape, dtype=np.float32).reshape(-1).view(np.uint8))
        return memoryview(rng.integers(0, 1 << 16, size=shape, dtype=np.uint16).reshape(-1).view(np.uint8))

    return LazyTensor("", dt, shape, nbytes, load)


def _named(name: str, t: LazyTensor) -> LazyTensor:
    return t.renamed(name)


def gpt2_xl_attn(path: Path, scale: float) -> int:
    e = 1600
    rows = max(2, int(e * scale))
    tensors = []
    for i in range(48):
        tensors.append(_named(f"transformer.h.{i}.attn.c_attn.weight", _random((rows, 3 * e), "F32", 2 * i)))
        tensors.append(_named(f"transformer.h.{i}.attn.c_attn.bias", _random((3 * e,), "F32", 2 * i + 1)))
    save(tensors, path, overwrite=True, metadata={"format": "pt"})
    return max(t.nbytes for t in tensors)


def mixtral_layer(path: Path, scale: float) -> int:
    hid, ffn = 4096, 7168
    f, h = max(2, int(ffn * scale)), max(2, int(hid * scale))
    tensors = []
    for x in range(8):
        p = f"model.layers.0.block_sparse_moe.experts.{x}."
        tensors += [_named(p + "w1.weight", _random((f, hid), "BF16", 3 * x)),
                    _named(p + "w2.weight", _random((h, ffn), "BF16", 3 * x + 1)),
                    _named(p + "w3.weight", _random((f, hid), "BF16", 3 * x + 2))]
    save(tensors, path, overwrite=True, metadata={"format": "pt"})
    return max(t.nbytes for t in tensors)


def migrate(recipe: str, src: Path, dst: Path) -> list[str]:
    return [sys.executable, "-m", "migrator.cli", "run", str(REPO / "recipes" / f"{recipe}.yaml"), "--source",
            str(src), "--target", str(dst), "--no-progress", "--overwrite"]


def prepare(cmd: list[str]) -> None:
    """An input made by a recipe, outside the timing."""
    import subprocess

    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir", nargs="?", default=str(REPO / "benchmarks" / "out" / "ops"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    gpt2, split = work / "gpt2-xl-attn.safetensors", work / "gpt2-xl-split.safetensors"
    moe, stacked = work / "mixtral-layer.safetensors", work / "mixtral-stacked.safetensors"
    out, copy = work / "out.safetensors", work / "copy.safetensors"
    largest = {"gpt2": gpt2_xl_attn(gpt2, args.scale), "moe": mixtral_layer(moe, args.scale)}
    prepare(migrate("gpt2-split-qkv", gpt2, split))
    prepare(migrate("mixtral-stack-experts", moe, stacked))
    jobs = [
        (harness.Job("gpt2-xl split qkv", migrate("gpt2-split-qkv", gpt2, out), out, gpt2), "gpt2"),
        (harness.Job("gpt2-xl merge qkv", migrate("gpt2-merge-qkv", split, out), out, split), "gpt2"),
        (harness.Job("mixtral stack experts", migrate("mixtral-stack-experts", moe, out), out, moe), "moe"),
        (harness.Job("mixtral unstack experts", migrate("mixtral-unstack-experts", stacked, out), out, stacked), "moe"),
        (harness.Job("cp+sync gpt2-xl attn", ["sh", "-c", 'cp "$1" "$2" && sync "$2"', "_", str(gpt2), str(copy)],
                     copy, gpt2), "gpt2"),
        (harness.Job("cp+sync mixtral layer", ["sh", "-c", 'cp "$1" "$2" && sync "$2"', "_", str(moe), str(copy)],
                     copy, moe), "moe"),
    ]
    print(harness.machine())
    res = harness.rounds([j for j, _ in jobs], args.rounds, work / "rss.txt")
    sizes = {"gpt2": gpt2.stat().st_size, "moe": moe.stat().st_size}
    print("\n| job | input | wall s (median) | peak RSS | bound (largest input + 150 MiB) | within |")
    print("|---|--:|--:|--:|--:|:-:|")
    ok = True
    for job, model in jobs:
        rss = res.rss(job.label)
        bound = largest[model] + BOUND_EXTRA
        within = job.label.startswith("cp") or rss <= bound
        ok &= within
        print(f"| {job.label} | {sizes[model] / 1e9:.2f} GB | {res.wall(job.label):.2f} | {harness.mib(rss)} | "
              f"{harness.mib(bound)} | {'yes' if within else 'NO'} |")
    if not args.keep:
        shutil.rmtree(work)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

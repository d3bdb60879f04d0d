"""DeepSeek-style FP8 folder -> BF16: migrator against compressed-tensors' `convert_checkpoint` and `cp`
(issue 43 item 4).

    python benchmarks/quantized.py [--layers 12] [--rounds 2] [--keep DIR]

Generates (once, into --keep or a temporary folder) a fine-grained FP8 model as DeepSeek-V3 stores it:
hidden 2048, FFN 8704, `--layers` layers, every linear weight F8_E4M3 (random codes, no NaN) with a
float32 `weight_scale_inv` per 128x128 block, norms and a 4096-token embedding/head in BF16, in three
~300 MB shards with an index and a config.json declaring `quant_method: fp8`. No download.

Then, in rounds (the order rotated each round; sync before and after each job, outside the timing; the
source read once beforehand so every job starts from a warm page cache):

* migrator: `migrate convert SRC OUT/ --dtype BF16` (folder target, fsync on, as shipped);
* compressed-tensors 0.20: `convert_checkpoint(SRC, OUT, FP8BlockDequantizer.from_pretrained(SRC))` on CPU
  (its default `max_workers`: one job at a time on CPU);
* `cp` of one file of the BF16 output's size, then `sync` of it (the floor of writing that many bytes).

Reports wall (median), peak RSS (max, GNU time's `%M`), CPU seconds (user + sys), the output GB per
wall second and per CPU second, and checks once that migrator's tensors equal compressed-tensors' bit
for bit. The machine is shared (2 cores, 8 other sessions): run it once or twice, not in a loop; the
figures are in benchmarks/RESULTS.md ("Quantized checkpoints"). Not run by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GNU_TIME = Path("/usr/bin/time")
HIDDEN, FFN, VOCAB, BLOCK = 2048, 8704, 4096, 128
LINEARS = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN, HIDDEN),
           "self_attn.v_proj": (HIDDEN, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
           "mlp.gate_proj": (FFN, HIDDEN), "mlp.up_proj": (FFN, HIDDEN), "mlp.down_proj": (HIDDEN, FFN)}

CT = ("import sys, torch\n"
      "from compressed_tensors.entrypoints.convert.convert_checkpoint import convert_checkpoint\n"
      "from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer\n"
      "c = FP8BlockDequantizer.from_pretrained(sys.argv[1], weight_block_size=(128, 128), dtype=torch.bfloat16)\n"
      "convert_checkpoint(sys.argv[1], sys.argv[2], c)\n")


def generate(folder: Path, layers: int, shards: int = 3) -> int:
    """The FP8 folder; returns the F8_E4M3 bytes written."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    rng = np.random.default_rng(0)
    tensors: list[tuple[str, torch.Tensor]] = [
        ("model.embed_tokens.weight", torch.from_numpy(rng.standard_normal((VOCAB, HIDDEN), np.float32)).bfloat16())]
    fp8 = 0
    for i in range(layers):
        for name, (rows, cols) in LINEARS.items():
            codes = rng.integers(0, 0x7E, size=(rows, cols), dtype=np.uint8)  # no NaN code (0x7F)
            codes |= (rng.integers(0, 2, size=(rows, cols), dtype=np.uint8) << 7)
            grid = (-(-rows // BLOCK), -(-cols // BLOCK))
            scale = (rng.random(grid, np.float32) * np.float32(2e-3) + np.float32(1e-4)).astype(np.float32)
            tensors.append((f"model.layers.{i}.{name}.weight", torch.from_numpy(codes).view(torch.float8_e4m3fn)))
            tensors.append((f"model.layers.{i}.{name}.weight_scale_inv", torch.from_numpy(scale)))
            fp8 += codes.nbytes
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors.append((f"model.layers.{i}.{norm}.weight", torch.ones(HIDDEN, dtype=torch.bfloat16)))
    tensors.append(("model.norm.weight", torch.ones(HIDDEN, dtype=torch.bfloat16)))
    tensors.append(("lm_head.weight", torch.from_numpy(rng.standard_normal((VOCAB, HIDDEN), np.float32)).bfloat16()))
    folder.mkdir(parents=True, exist_ok=True)
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    per, weight_map, shard, size, part = total / shards, {}, 1, 0, {}

    def flush() -> None:
        file = f"model-{shard:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))

    for name, t in tensors:
        part[name] = t
        size += t.numel() * t.element_size()
        if size >= per * shard and shard < shards:
            flush()
            shard, part = shard + 1, {}
    flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
              "intermediate_size": FFN, "num_hidden_layers": layers, "num_attention_heads": 16,
              "num_key_value_heads": 16, "vocab_size": VOCAB, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [BLOCK, BLOCK]}}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return fp8


def timed(cmd: list[str], env: dict[str, str], stats: Path) -> dict[str, float]:
    """Wall, peak RSS (bytes) and CPU seconds of one command, between two syncs."""
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    proc = subprocess.run([str(GNU_TIME), "-f", "%M %U %S", "-o", str(stats), *cmd], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    subprocess.run(["sync"], check=True)
    rss, user, system = stats.read_text().split()[-3:]
    return {"wall": wall, "rss": int(rss) * 1024, "cpu": float(user) + float(system)}


def warm(*files: Path) -> None:
    """Read files through the page cache."""
    buf = bytearray(16 << 20)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def same_tensors(a: Path, b: Path) -> tuple[int, list[str]]:
    """(tensors compared, names that differ) between two safetensors folders, byte for byte."""
    import torch
    from safetensors import safe_open

    def index(folder: Path) -> dict[str, Path]:
        out = {}
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), "pt") as h:
                out.update(dict.fromkeys(h.keys(), f))
        return out

    ia, ib = index(a), index(b)
    differ = sorted(set(ia) ^ set(ib))
    for name in sorted(set(ia) & set(ib)):
        with safe_open(str(ia[name]), "pt") as ha, safe_open(str(ib[name]), "pt") as hb:
            ta, tb = ha.get_tensor(name), hb.get_tensor(name)
            if ta.dtype != tb.dtype or ta.shape != tb.shape or not torch.equal(
                    ta.contiguous().view(-1).view(torch.uint8), tb.contiguous().view(-1).view(torch.uint8)):
                differ.append(name)
    return len(set(ia) & set(ib)), differ


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", help="write (or reuse) the FP8 folder and the outputs here")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="fp8-bench-"))
    src = work / "fp8"
    if not (src / "config.json").exists():
        generate(src, args.layers)
    fp8 = sum(r * c for r, c in LINEARS.values()) * json.loads((src / "config.json").read_text())["num_hidden_layers"]
    stored = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    out_bytes = stored + fp8  # every F8 byte becomes two, the scales leave (a few MB): about
    floor = work / "floor.bin"
    if not floor.exists() or floor.stat().st_size != out_bytes:
        with open(floor, "wb") as f:  # incompressible, not sparse: cp copies every byte
            chunk = os.urandom(16 << 20)
            left = out_bytes
            while left:
                left -= f.write(chunk[:min(left, len(chunk))])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    outs = {"migrator": work / "out-migrator", "compressed-tensors": work / "out-ct", "cp+sync": work / "floor-copy"}
    jobs = {
        "migrator": [sys.executable, "-m", "migrator.cli", "convert", str(src), f"{outs['migrator']}/", "--dtype",
                     "BF16", "--copy", "config.json"],
        "compressed-tensors": [sys.executable, "-c", CT, str(src), str(outs["compressed-tensors"])],
        "cp+sync": ["sh", "-c", 'cp "$1" "$2" && sync "$2"', "_", str(floor), str(outs["cp+sync"])],
    }
    names = list(jobs)
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    stats = work / "time.txt"
    for i in range(args.rounds):
        k = i % len(names)
        for name in [*names[k:], *names[:k]]:
            remove(outs[name])
            warm(*src.iterdir(), *([floor] if name == "cp+sync" else []))
            r = timed(jobs[name], env, stats)
            runs[name].append(r)
            print(f"  round {i + 1}/{args.rounds} {name}: {r['wall']:.2f} s, {r['rss'] / 2**20:.0f} MiB, "
                  f"cpu {r['cpu']:.2f} s", flush=True)
    remove(outs["cp+sync"])
    n, differ = same_tensors(outs["migrator"], outs["compressed-tensors"])
    written = sum(f.stat().st_size for f in outs["migrator"].glob("*.safetensors"))
    largest = max(r * c for r, c in LINEARS.values()) * 2
    print(f"\nFP8 folder: {args.layers} layers, {fp8 / 1e6:.0f} MB of F8_E4M3 ({stored / 1e6:.0f} MB stored in "
          f"3 shards); BF16 output {written / 1e6:.0f} MB; largest output tensor {largest / 2**20:.0f} MiB "
          f"(RSS bound {largest / 2**20 + 150:.0f} MiB). {args.rounds} rounds; {os.cpu_count()} cores.")
    print(f"migrator vs compressed-tensors: {n} tensors compared, {len(differ)} differ {differ[:5]}")
    print("| job | wall s (median) | peak RSS | CPU s | output GB/s (wall) | GB/s per CPU s |")
    print("|---|--:|--:|--:|--:|--:|")
    for name in names:
        wall = statistics.median(r["wall"] for r in runs[name])
        cpu = statistics.median(r["cpu"] for r in runs[name])
        rss = max(r["rss"] for r in runs[name])
        print(f"| {name} | {wall:.2f} | {rss / 2**20:,.0f} MiB | {cpu:.2f} | {written / 1e9 / wall:.2f} | "
              f"{written / 1e9 / cpu if cpu else float('nan'):.2f} |")
    if not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()

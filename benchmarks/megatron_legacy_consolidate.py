"""Legacy Megatron-LM checkpoint (TP=2 x PP=2) -> SafeTensors: migrator vs torch.load + torch.cat, wall and RSS.

    python benchmarks/megatron_legacy_consolidate.py [--hidden 1024] [--layers 8] [--rounds 3] [--keep DIR]

Writes a legacy checkpoint (`iter_0000010/mp_rank_TT_PPP/model_optim_rng.pt`, as Megatron-LM's `torch`
checkpointer lays it out: `tests/support/megatron_legacy.py`, a Llama-like model with GQA and SwiGLU,
random fp32 weights, vocabulary 32,768), then runs each job in a fresh process per round, alternating,
and reports the median wall time and the peak RSS (ru_maxrss of the child):

* migrator: `migrate convert CKPT out.safetensors` (ranks joined lazily, one tensor at a time);
* the way converters without migrator do it (Megatron-LM's and transformers' conversion scripts):
  `torch.load` every rank file, `torch.cat` each tensor's pieces (SwiGLU halves re-interleaved),
  renumber the stages' layers, `safetensors.torch.save_file` the whole dict.

Both outputs are compared tensor for tensor at the end. Not run by the tests.

Measured (2 shared cores under a load of ~9, page cache warm, `--rounds 2`, defaults): 988 MiB in 4
rank files (720 MiB of weights, the rest optimizer state), largest tensor 128 MiB (the output layer);
both outputs equal. migrator 6.55 s, peak RSS 98 MiB; torch.load + cat 29.31 s, peak RSS 1933 MiB.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WRITER = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])  # the repository: the tests' writer
import tests.support.megatron_legacy as mls
hidden, layers = int(sys.argv[3]), int(sys.argv[4])
args = mls.args_for(2, 2, hidden_size=hidden, num_attention_heads=hidden // 64, num_query_groups=4, kv_channels=64,
                    ffn_hidden_size=hidden * 4, padded_vocab_size=32768, num_layers=layers)
mls.write_legacy(Path(sys.argv[2]), mls.random_mcore(args), 2, 2, args=args, extra_state=False)
"""

PEER = r"""
import sys, torch
from pathlib import Path
sys.path.insert(0, sys.argv[3])  # the args' enum class (tests.support.megatron_legacy), which torch.load imports
from safetensors.torch import save_file
root = Path(sys.argv[1]) / "iter_0000010"
tp, pp = 2, 2
files = {(t, p): torch.load(root / f"mp_rank_{t:02d}_{p:03d}" / "model_optim_rng.pt", weights_only=False)
         for t in range(tp) for p in range(pp)}
per_stage = files[(0, 0)]["args"].num_layers // pp
out = {}
for p in range(pp):
    for name in files[(0, p)]["model"]:
        if name.endswith("_extra_state"):
            continue
        parts = [files[(t, p)]["model"][name] for t in range(tp)]
        if name.endswith(("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight")):
            joined = torch.cat(parts, 0)
        elif name.endswith("linear_fc1.weight"):
            halves = [x.chunk(2, 0) for x in parts]
            joined = torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
        elif name.endswith(("linear_proj.weight", "linear_fc2.weight")):
            joined = torch.cat(parts, 1)
        else:
            joined = parts[0]
        if name.startswith("decoder.layers."):
            i = int(name.split(".")[2])
            name = name.replace(f"decoder.layers.{i}.", f"decoder.layers.{p * per_stage + i}.", 1)
        out[name] = joined.contiguous()
save_file(out, sys.argv[2])
"""

COMPARE = r"""
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())[:5]
assert all(a[k].equal(b[k]) for k in a), [k for k in a if not a[k].equal(b[k])][:5]
print(f"equal: {len(a)} tensors")
"""


def measure(cmd: list[str]) -> tuple[float, int]:
    """Through a wrapper process, so each job's ru_maxrss is its own."""
    wrapper = ("import resource, subprocess, sys, time; s = time.perf_counter(); "
               "subprocess.run(sys.argv[1:], check=True, capture_output=True); "
               "print(time.perf_counter() - s, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)")
    done = subprocess.run([sys.executable, "-c", wrapper, *cmd], check=True, capture_output=True, text=True)
    wall, rss = done.stdout.split()
    return float(wall), int(rss)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keep", type=Path, default=None, help="write the checkpoint here and keep it")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="megatron-bench-"))
    ckpt = a.keep if a.keep is not None else work / "ckpt"
    try:
        if not (ckpt / "iter_0000010").is_dir():
            subprocess.run([sys.executable, "-c", WRITER, str(REPO), str(ckpt), str(a.hidden), str(a.layers)],
                           check=True)
        size = sum(f.stat().st_size for f in ckpt.rglob("*.pt"))
        print(f"checkpoint: {size / 2**20:.0f} MiB in 4 rank files")
        jobs = {
            "migrator": [sys.executable, "-m", "migrator.cli", "convert", str(ckpt), str(work / "m.safetensors"),
                         "--overwrite"],
            "torch.load + cat": [sys.executable, "-c", PEER, str(ckpt), str(work / "p.safetensors"), str(REPO)],
        }
        results: dict[str, list[tuple[float, int]]] = {k: [] for k in jobs}
        for _ in range(a.rounds):
            for name, cmd in jobs.items():
                results[name].append(measure(cmd))
        for name, runs in results.items():
            print(f"{name}: wall {statistics.median(w for w, _ in runs):.2f} s, "
                  f"peak RSS {max(r for _, r in runs)} MiB")
        subprocess.run([sys.executable, "-c", COMPARE, str(work / "m.safetensors"), str(work / "p.safetensors")],
                       check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""LoRA folds and two-model merges at model scale: migrator against PEFT and mergekit, same rounds.

    PYTHONPATH=$PWD python benchmarks/merges.py [WORKDIR] [--sizes small,large] [--rounds 1] [--keep] [--breakdown]

Models (generated tensor by tensor into WORKDIR, default benchmarks/out/merges; deleted at the end
unless --keep), Llama-shaped F32 Hugging Face folders in 200 MB shards with a config.json:
- small: hidden 768, 12 layers, vocab 32000: 134M parameters, 537 MB, largest tensor 98 MB;
- large: hidden 2048, 9 layers, vocab 32000: 527M parameters, 2.11 GB, largest tensor 262 MB.
Per size: a base, a second model (the base plus a small delta) and a PEFT LoRA adapter of the base
(r 16 on every projection, non-zero lora_B), written as PEFT's save_pretrained writes one.

Jobs, each its own process, timed by harness.run (sync before and after, inputs warm, GNU time for
peak RSS), rounds rotated: migrator `convert BASE OUT/ --lora` against PEFT `PeftModel.from_pretrained`
+ `merge_and_unload` + `save_pretrained` (200 MB shards); migrator `merge` of linear, slerp and ties
configs against `mergekit-yaml` on the same configs; `migrate convert BASE OUT/` (the same folder
with nothing computed: the I/O floor of a migrator job, so that the rest is the arithmetic); and
`cp -r` of the inputs. The RSS bound of a job: (inputs + 1) x the largest tensor + 150 MiB.
Each job line gives the load average when it ended (the host is shared). `--breakdown` then times
each migrator job again in one process: computing its tensors without writing them (read + compute),
writing without fsync, and the whole job.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import harness  # noqa: E402

BOUND_EXTRA = 150 << 20
SIZES = {"small": {"hidden": 768, "ffn": 2048, "layers": 12, "heads": 12, "kv": 12, "vocab": 32000},
         "large": {"hidden": 2048, "ffn": 5632, "layers": 9, "heads": 32, "kv": 4, "vocab": 32000}}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RANK = 16
CONFIGS = {
    "linear": "merge_method: linear\nmodels:\n  - {model: base, parameters: {weight: 0.5}}\n"
              "  - {model: other, parameters: {weight: 0.5}}\ndtype: float32\n",
    "slerp": "merge_method: slerp\nbase_model: base\nmodels:\n  - {model: base}\n  - {model: other}\n"
             "parameters: {t: 0.3}\ndtype: float32\n",
    "ties": "merge_method: ties\nbase_model: base\nmodels:\n  - {model: other, parameters: {weight: 1.0, "
            "density: 0.5}}\nparameters: {normalize: true}\ndtype: float32\n",
}
PEFT_MERGE = """
import sys, torch, transformers, peft
base, adapter, out = sys.argv[1:4]
model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
merged = peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
merged.save_pretrained(out, max_shard_size="200MB")
"""


def shapes(c: dict[str, int]) -> list[tuple[str, tuple[int, ...]]]:
    head = c["hidden"] // c["heads"]
    out = [("model.embed_tokens.weight", (c["vocab"], c["hidden"]))]
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (c["hidden"], c["hidden"])),
                (p + "self_attn.k_proj.weight", (c["kv"] * head, c["hidden"])),
                (p + "self_attn.v_proj.weight", (c["kv"] * head, c["hidden"])),
                (p + "self_attn.o_proj.weight", (c["hidden"], c["hidden"])),
                (p + "mlp.gate_proj.weight", (c["ffn"], c["hidden"])),
                (p + "mlp.up_proj.weight", (c["ffn"], c["hidden"])),
                (p + "mlp.down_proj.weight", (c["hidden"], c["ffn"])),
                (p + "input_layernorm.weight", (c["hidden"],)),
                (p + "post_attention_layernorm.weight", (c["hidden"],))]
    return [*out, ("model.norm.weight", (c["hidden"],)), ("lm_head.weight", (c["vocab"], c["hidden"]))]


def _random(name: str, shape: tuple[int, ...], seed: int, scale: float = 0.02, shift: int | None = None) -> object:
    """A lazy F32 tensor made when written (one in memory at a time); `shift` adds a second seed's delta."""
    import numpy as np

    from migrator.core import dtypes
    from migrator.core.tensor import LazyTensor

    def load() -> memoryview:
        a = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * np.float32(scale)
        if shift is not None:
            a += np.random.default_rng(shift).standard_normal(shape, dtype=np.float32) * np.float32(scale / 4)
        return memoryview(a.reshape(-1).view(np.uint8))

    dt = dtypes.parse("F32")
    return LazyTensor(name, dt, shape, dt.nbytes(shape), load)  # type: ignore[arg-type]


def make_models(work: Path, c: dict[str, int]) -> int:
    """base/, other/ (base + a delta), adapter/ in `work`; returns the largest tensor's bytes."""
    from migrator import save

    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": c["hidden"],
              "intermediate_size": c["ffn"], "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"],
              "num_key_value_heads": c["kv"], "vocab_size": c["vocab"], "max_position_embeddings": 2048,
              "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "dtype": "float32"}
    specs = shapes(c)
    for name, shift in (("base", None), ("other", 1000)):
        tensors = [_random(n, s, i, shift=None if shift is None else shift + i) for i, (n, s) in enumerate(specs)]
        save(tensors, work / name, metadata={"format": "pt"}, overwrite=True, max_shard_size="200MB")  # type: ignore[arg-type]
        (work / name / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    lora = []
    for i, (n, s) in enumerate(specs):
        if n.split(".")[-2] in PROJECTIONS:
            p = "base_model.model." + n[: -len(".weight")]
            lora += [_random(p + ".lora_A.weight", (RANK, s[1]), 5000 + 2 * i, 0.05),
                     _random(p + ".lora_B.weight", (s[0], RANK), 5001 + 2 * i, 0.05)]
    (work / "adapter").mkdir(exist_ok=True)
    save(lora, work / "adapter" / "adapter_model.safetensors", metadata={"format": "pt"}, overwrite=True)  # type: ignore[arg-type]
    (work / "adapter" / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(work / "base"), "r": RANK,
        "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": list(PROJECTIONS), "bias": "none",
        "fan_in_fan_out": False, "use_rslora": False, "use_dora": False}, indent=2) + "\n")
    for name, text in CONFIGS.items():  # absolute model paths: mergekit reads them from its working folder
        (work / f"{name}.yml").write_text(text.replace("base", str(work / "base")).replace("other", str(work / "other"))
                                          .replace(f"{work}/base_model", "base_model"))
    return max(4 * (s[0] * (s[1] if len(s) > 1 else 1)) for _, s in specs)


def jobs(work: Path) -> list[tuple[harness.Job, Path, int]]:
    """(job, output folder, inputs read) per job."""
    py, out = sys.executable, work / "out"
    migrate = [py, "-m", "migrator.cli"]
    res = [(harness.Job("migrator LoRA fold", [*migrate, "convert", str(work / "base"), f"{out}/", "--lora",
                                                str(work / "adapter"), "--no-progress", "--max-shard-size", "200MB"]),
            out, 2),
           (harness.Job("PEFT merge_and_unload + save_pretrained", [py, "-c", PEFT_MERGE, str(work / "base"),
                                                                    str(work / "adapter"), str(out)]), out, 2),
           (harness.Job("migrator copy (nothing computed)", [*migrate, "convert", str(work / "base"), f"{out}/",
                                                             "--no-progress", "--max-shard-size", "200MB"]), out, 1),
           (harness.Job("cp -r base + adapter", ["sh", "-c", 'cp -r "$1" "$2" && cp -r "$3" "$2/adapter" && sync',
                                                 "_", str(work / "base"), str(out), str(work / "adapter")]), out, 2),
           (harness.Job("cp -r two models", ["sh", "-c", 'cp -r "$1" "$3" && cp -r "$2" "$3/other" && sync', "_",
                                             str(work / "base"), str(work / "other"), str(out)]), out, 2)]
    for name in CONFIGS:
        res.append((harness.Job(f"migrator merge {name}", [*migrate, "merge", str(work / f"{name}.yml"), str(out),
                                                           "--no-progress", "--max-shard-size", "200MB"]), out, 2))
        res.append((harness.Job(f"mergekit-yaml {name}", [str(Path(py).parent / "mergekit-yaml"),
                                                          str(work / f"{name}.yml"), str(out), "--out-shard-size",
                                                          "200M", "--quiet", "--no-copy-tokenizer",
                                                          "--no-write-model-card"]), out, 2))
    return res


BREAKDOWN = """
import os, shutil, sys, time
from migrator.transform.merging.folded import open_folded
from migrator.transform.merging.merged import MergedReader
from migrator.files.io import open_file
from migrator.run import merge as execute
from migrator.run.convert import convert
work, job, out = sys.argv[1:4]

def drain():
    reader = (open_folded(open_file(f"{work}/base"), f"{work}/adapter") if job == "fold"
              else MergedReader(f"{work}/{job}.yml"))
    with reader:
        for t in reader.tensors:
            if t.chunks is not None:
                for _ in t.chunks():
                    pass
            else:
                t.data().release()

def write(fsync):
    shutil.rmtree(out, ignore_errors=True)
    if job == "fold":
        convert(f"{work}/base", out + "/", lora=f"{work}/adapter", max_shard_size="200MB", fsync=fsync,
                progress=False)
    else:
        execute.merge(f"{work}/{job}.yml", out, max_shard_size="200MB", fsync=fsync, progress=False)
    shutil.rmtree(out, ignore_errors=True)

for label, fn in (("read + compute", drain), ("+ write", lambda: write(False)), ("+ fsync", lambda: write(True))):
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    print(f"{job}: {label}: {time.perf_counter() - start:.2f} s wall, {time.process_time() - cpu:.2f} s CPU, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
"""
"""Where a migrator job's time goes, in one process: its tensors computed and dropped (reading and the
arithmetic), then written without fsync, then written and fsynced."""


def breakdown(work: Path) -> None:
    import os
    import subprocess

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # as the CLI sets it: the bands run on the cast pool
    for job in ("fold", *CONFIGS):
        subprocess.run([sys.executable, "-c", BREAKDOWN, str(work), job, str(work / "out")], check=True, env=env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir", nargs="?", default=str(REPO / "benchmarks" / "out" / "merges"))
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--skip", default="", help="comma-separated job labels (or prefixes) not to run")
    ap.add_argument("--keep", action="store_true", help="keep the generated models")
    ap.add_argument("--breakdown", action="store_true", help="after the rounds, where each migrator job's time "
                    "goes: read + compute, + write, + fsync (in one process each)")
    args = ap.parse_args(argv)
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(harness.machine())
    print("\n| model | job | wall s | x cp -r | x migrator | peak RSS | bound | within |")
    print("|---|---|--:|--:|--:|--:|--:|:-:|")
    ok = True
    for size in args.sizes.split(","):
        work = Path(args.workdir) / size
        work.mkdir(parents=True, exist_ok=True)
        largest = make_models(work, SIZES[size])
        todo = [j for j in jobs(work) if not any(j[0].label.startswith(s) for s in args.skip.split(",") if s)]
        walls: dict[str, list[float]] = {j.label: [] for j, _, _ in todo}
        rss: dict[str, int] = {j.label: 0 for j, _, _ in todo}
        for r in range(args.rounds):
            k = r % len(todo)
            for job, out, _ in [*todo[k:], *todo[:k]]:
                shutil.rmtree(out, ignore_errors=True)
                for f in ("base", "other", "adapter"):
                    for p in (work / f).iterdir():
                        harness.warm(p)
                run = harness.run(job, work / "rss.txt")
                shutil.rmtree(out, ignore_errors=True)
                walls[job.label].append(run.wall)
                rss[job.label] = max(rss[job.label], run.peak_rss)
                load = " ".join(f"{x:.1f}" for x in os.getloadavg())
                print(f"  {size} round {r + 1} {job.label}: {run.wall:.2f} s, {harness.mib(run.peak_rss)} "
                      f"(load {load})", flush=True)
        import statistics

        med = {k: statistics.median(v) for k, v in walls.items()}
        for job, _, inputs in todo:
            label = job.label
            cp = med.get("cp -r base + adapter" if "LoRA" in label or "PEFT" in label else "cp -r two models")
            ours = med.get("migrator LoRA fold" if "PEFT" in label else
                           f"migrator merge {label.split()[-1]}" if label.startswith("mergekit") else label)
            bound = (inputs + 1) * largest + BOUND_EXTRA
            within = "" if not label.startswith("migrator") else ("yes" if rss[label] <= bound else "NO")
            ok &= within != "NO"
            print(f"| {size} | {label} | {med[label]:.1f} | {med[label] / cp:.2f} | "
                  f"{med[label] / ours:.2f} | {harness.mib(rss[label])} | "
                  f"{harness.mib(bound) if within else ''} | {within} |" if cp and ours else
                  f"| {size} | {label} | {med[label]:.1f} | | | {harness.mib(rss[label])} | | |")
        if args.breakdown:
            breakdown(work)
        if not args.keep:
            shutil.rmtree(work)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""A megatron-core `torch_dist` checkpoint read into one file: migrator against what users run, wall time
and peak RSS, same rounds.

    PYTHONPATH=$PWD python benchmarks/torch_dist_consolidate.py [--rounds 2] [--dir /tmp/torch-dist-bench] [--keep]

The checkpoint: megatron-core 0.16.1's `dist_checkpointing.save` of a Llama-like `GPTModel` (local layer
spec, RMSNorm, SwiGLU, RoPE, grouped-query attention: hidden 2048, 16 heads in 4 key/value groups, FFN
5632, 4 layers, a tokenizer of 32,001 tokens padded to 32,256, untied output layer, random fp32
weights), tensor-parallel over 2 gloo ranks on CPU, with Megatron-LM's `args` in `common.pt`: ~1.25 GB
in 2 `.distcp` files. The writing processes shim `torch.cuda.synchronize` / `current_device`, as
`tests/support/torch_dist.py` does (megatron-core's async saver calls them unconditionally).

Jobs, each its own process, timed by `harness.run` (input read once before each job, `sync` before and
after outside the timing, peak RSS from GNU time, mapped file pages included), rounds rotated:

* `migrate convert CKPT out.safetensors` (durable: fsynced before its rename), Megatron's names one
  tensor per layer, the vocabulary's padding rows cut;
* `migrate run recipes/megatron-llama-to-hf.yaml --source CKPT --target HF/` (LlamaForCausalLM, with
  config.json made from the arguments);
* megatron-core's `load_plain_tensors` (a 1-rank gloo group, which it needs) + safetensors
  `save_file`: Megatron's stacked tensors, every tensor in memory at once;
* slime's way (`tools/convert_torch_dist_to_hf.py`, re-implemented here from its description, not
  copied): `.metadata` unpickled with megatron's classes replaced by dummies, every non-`_state`
  tensor allocated and read whole by torch DCP (`_load_state_dict(no_dist=True)`), the stacked layer
  axis cut into per-layer tensors, `save_file`. slime then renames to Hugging Face names (its
  `convert_to_hf`, which needs slime and megatron); that step is left out here, as it reads no bytes;
* `cp -r CKPT` and `cp -r` + `sync`: the floor, the same bytes copied.

Afterwards migrator's `.safetensors` is compared, tensor for tensor, with megatron's plain tensors
(each layer of a stacked tensor, the vocabulary without its padding). Not run by the tests.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import harness  # noqa: E402

BOUND_EXTRA = 150 << 20
HIDDEN, HEADS, GROUPS, FFN, LAYERS, VOCAB, PADDED, SEQ = 2048, 16, 4, 5632, 4, 32001, 32256, 4096


def _args() -> argparse.Namespace:
    """Megatron-LM's training arguments for the model, as `common.pt` holds them."""
    import torch

    return argparse.Namespace(
        num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        group_query_attention=True, num_query_groups=GROUPS, kv_channels=HIDDEN // HEADS,
        max_position_embeddings=SEQ, padded_vocab_size=PADDED, vocab_size=VOCAB, normalization="RMSNorm",
        norm_epsilon=1e-5, swiglu=True, position_embedding_type="rope", rotary_base=10000, rotary_percent=1.0,
        rotary_interleaved=False, untie_embeddings_and_output_weights=True, add_bias_linear=False,
        add_qkv_bias=False, qk_layernorm=False, params_dtype=torch.float32, bf16=False, fp16=False,
        tensor_model_parallel_size=2, pipeline_model_parallel_size=1, num_experts=None, iteration=100)


def _worker(rank: int, port: int, out: str) -> None:
    import torch

    from tests.support.torch_dist import join_megatron_group

    join_megatron_group(rank, 2, port)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    torch.manual_seed(1234)
    cfg = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
        ffn_hidden_size=FFN, kv_channels=HIDDEN // HEADS, use_cpu_initialization=True, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, normalization="RMSNorm", layernorm_epsilon=1e-5,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.02)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=PADDED, max_sequence_length=SEQ, position_embedding_type="rope",
                     rotary_base=10000, share_embeddings_and_output_weights=False)
    sd = model.sharded_state_dict()
    sd["args"], sd["checkpoint_version"], sd["iteration"] = _args(), 3.0, 100
    dist_checkpointing.save(sd, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    from tests.support.dist import end_rank

    end_rank()


def make_checkpoint(out: Path) -> None:
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(out)), nprocs=2, join=True)


MCORE_PEER = r"""
import os, sys, torch
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3], RANK="0", WORLD_SIZE="1")
torch.distributed.init_process_group("gloo", rank=0, world_size=1)
from megatron.core.dist_checkpointing import load_plain_tensors
from safetensors.torch import save_file
plain = load_plain_tensors(sys.argv[1])
save_file({k: v for k, v in plain.items() if isinstance(v, torch.Tensor)}, sys.argv[2])
torch.distributed.destroy_process_group()
"""

SLIME_PEER = r"""
import pickle, re, sys, torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from safetensors.torch import save_file

class Stubs(pickle.Unpickler):  # megatron's classes become dummies: megatron need not be importable
    def find_class(self, module, name):
        if module.split(".")[0] == "megatron":
            return type(name, (), {"__init__": lambda self, *a, **k: None})
        return super().find_class(module, name)

class Reader(dcp.FileSystemReader):
    def read_metadata(self):
        with open(self.path / ".metadata", "rb") as f:
            meta = Stubs(f).load()
        meta.planner_data = meta.planner_data or {}
        return meta

class Everything(DefaultLoadPlanner):  # an empty tensor of every stored size, then read into
    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        for k, v in metadata.state_dict_metadata.items():
            if "optimizer" not in k and "_state" not in k and isinstance(v, TensorStorageMetadata):
                state_dict[k] = torch.empty(v.size, dtype=v.properties.dtype)
        super().set_up_planner(state_dict, metadata, is_coordinator)

sd = {}
dcp.state_dict_loader._load_state_dict(sd, storage_reader=Reader(sys.argv[1]), planner=Everything(), no_dist=True)
out = {}
for name in list(sd):
    t = sd.pop(name)
    if name.startswith("decoder.layers.") and not re.match(r"decoder\.layers\.\d+\.", name):
        for i in range(t.shape[0]):  # a view would share storage, which save_file refuses
            out[name.replace("decoder.layers.", f"decoder.layers.{i}.", 1)] = t[i].clone()
    else:
        out[name] = t
    del t
save_file(out, sys.argv[2])
"""

COMPARE = r"""
import sys, torch
from safetensors.torch import load_file
ours, plain = load_file(sys.argv[1]), load_file(sys.argv[2])
vocab, seen = int(sys.argv[3]), 0
for name, t in ours.items():
    parts = name.split(".")
    if name.startswith("decoder.layers."):
        expected = plain["decoder.layers." + ".".join(parts[3:])][int(parts[2])]
    elif name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        expected = plain[name][:vocab]
    else:
        expected = plain[name]
    assert torch.equal(t, expected), name
    seen += 1
print(f"migrator's {seen} tensors equal megatron's load_plain_tensors")
"""


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/torch-dist-bench"))
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint for the next run")
    ap.add_argument("--no-recipe", action="store_true", help="leave out the `migrate run` job")
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = str(REPO)
    work: Path = args.dir
    ckpt = work / "ckpt"
    if not (ckpt / "common.pt").exists():  # in a process of its own, so this one stays small
        subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = sys.argv[1:3]; import torch_dist_consolidate "
                        "as b; from pathlib import Path; b.make_checkpoint(Path(sys.argv[3]))",
                        str(REPO / "benchmarks"), str(REPO), str(ckpt)], check=True)
    files = [f for f in ckpt.iterdir() if f.is_file()]
    size = sum(f.stat().st_size for f in files)
    py, migrate = sys.executable, [sys.executable, "-m", "migrator.cli"]
    out_st, hf, copy = work / "out.safetensors", work / "hf", work / "copy"
    jobs = [
        harness.Job("migrate convert", [*migrate, "convert", str(ckpt), str(out_st), "--overwrite", "--no-progress"],
                    out_st, ckpt),
        harness.Job("load_plain_tensors + save_file", [py, "-c", MCORE_PEER, str(ckpt), str(work / "mcore.safetensors"),
                                                       _port()], work / "mcore.safetensors", ckpt),
        harness.Job("slime's DCP load + save_file", [py, "-c", SLIME_PEER, str(ckpt), str(work / "slime.safetensors")],
                    work / "slime.safetensors", ckpt),
        harness.Job("cp -r", ["cp", "-r", str(ckpt), str(copy)], copy, ckpt),
        harness.Job("cp -r + sync", ["sh", "-c", 'cp -r "$1" "$2" && sync "$2"/* "$2"/.metadata', "_", str(ckpt),
                                     str(copy)], copy, ckpt),
    ]
    if not args.no_recipe:
        jobs.insert(1, harness.Job("migrate run megatron-llama-to-hf", [
            *migrate, "run", str(REPO / "recipes" / "megatron-llama-to-hf.yaml"), "--source", str(ckpt),
            "--target", str(hf), "--no-progress"], hf, ckpt))
    load_before = os.getloadavg()
    print(f"{harness.machine()}\ncheckpoint: {size / 1e9:.2f} GB ({size / 2**20:,.0f} MiB) in {len(files)} files; "
          f"load average before: {' '.join(f'{x:.2f}' for x in load_before)}", flush=True)
    res = harness.rounds(jobs, args.rounds, work / "rss.txt")
    load_after = os.getloadavg()

    # the check, untimed: migrator's output against megatron's own reading
    subprocess.run([*migrate, "convert", str(ckpt), str(out_st), "--overwrite", "--no-progress"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([py, "-c", MCORE_PEER, str(ckpt), str(work / "mcore.safetensors"), _port()], check=True)
    subprocess.run([py, "-c", COMPARE, str(out_st), str(work / "mcore.safetensors"), str(VOCAB)], check=True)
    from safetensors import safe_open

    with safe_open(str(out_st), "np") as f:
        names = f.keys()
        largest = max(math.prod(f.get_slice(k).get_shape()) * 4 for k in names)  # every tensor is F32
    for p in (out_st, work / "mcore.safetensors"):
        p.unlink(missing_ok=True)

    bound = largest + BOUND_EXTRA
    print(f"load average after: {' '.join(f'{x:.2f}' for x in load_after)}; largest tensor written "
          f"{harness.mib(largest)}, bound {harness.mib(bound)}; {args.rounds} rounds, medians\n")
    print("| job | wall (median) | x cp -r + sync | peak RSS (max) |\n|---|--:|--:|--:|")
    for job in jobs:
        rss = res.rss(job.label)
        mark = "" if not job.label.startswith("migrate") else (" (within)" if rss <= bound else " **over the bound**")
        print(f"| {job.label} | {res.wall(job.label):.2f} s | {res.ratio(job.label, 'cp -r + sync'):.2f}x | "
              f"{harness.mib(rss)}{mark} |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

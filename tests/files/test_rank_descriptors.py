"""Rank sets of more files than the process may hold open are read: every rank-set reader (FSDP1
ShardedTensor ranks, DCP's Hugging Face layout) reads through a few reopened descriptors
(`core.reopening`), never one per rank file.

Each case converts a 300-rank set in a new process whose soft RLIMIT_NOFILE is 64 (set there with
`resource.setrlimit`, so the test process keeps its own): a reader holding every rank open fails at
the 60th file with EMFILE. The output is compared with the tensor the set was cut from (torch's, saved
by the writer; numpy's for the SafeTensors layout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from migrator import from_numpy, save

RANKS = 300
LIMIT = 64
ROOT = Path(__file__).resolve().parents[2]

CONVERT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from migrator.cli import main
sys.exit(main(["convert", *sys.argv[2:]]))
"""

FSDP1 = """
import sys, warnings, torch, torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import ShardedTensor, Shard
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
from torch.testing._internal.distributed.fake_pg import FakeStore
warnings.simplefilter("ignore")
out, n = sys.argv[1], int(sys.argv[2])
w = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
torch.save(w, f"{out}/../whole.pt")
for k in range(n):  # each rank's file as FSDP1's SHARDED_STATE_DICT saves it: row k on rank k
    dist.init_process_group("fake", store=FakeStore(), rank=k, world_size=n)
    metas = [ShardMetadata([r, 0], [1, 3], f"rank:{r}/cpu") for r in range(n)]
    md = ShardedTensorMetadata(metas, w.size(), TensorProperties(dtype=w.dtype))
    st = ShardedTensor._init_from_local_shards_and_global_metadata([Shard(w[k:k + 1].clone(), metas[k])], md)
    torch.save({"w": st, "step": torch.tensor(3)}, f"{out}/model_rank{k}.pt")
    dist.destroy_process_group()
"""


def convert_limited(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", CONVERT, str(LIMIT), *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_fsdp1_ranks_beyond_the_descriptor_limit(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    subprocess.run([sys.executable, "-c", FSDP1, str(folder), str(RANKS)], check=True, timeout=300)
    out = tmp_path / "out.safetensors"
    done = convert_limited(str(folder), str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    got = load_file(out)
    assert np.array_equal(got["w"], torch.load(tmp_path / "whole.pt").numpy())


def test_hf_layout_ranks_beyond_the_descriptor_limit(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    whole = np.random.default_rng(0).standard_normal((RANKS, 4)).astype(np.float32)
    for r in range(1, RANKS + 1):  # rank r's file holds row r-1, placed by DCP_SHARDING_INFO
        info = json.dumps({"w": {"saved_offsets": [r - 1, 0]}})
        save([from_numpy("w", whole[r - 1:r])], folder / f"shard-{r:05d}-model-00001-of-00001.safetensors",
             metadata={"format": "pt", "DCP_SHARDING_INFO": info, "DCP_VERSION": "1.0"})
    out = tmp_path / "out.safetensors"
    done = convert_limited(str(folder), str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert np.array_equal(load_file(out)["w"], whole)

"""Hostile per-rank DTensor files (verl's model_world_size_N_rank_K.pt) given to `migrate convert`:
placements, global shapes, meshes and local shards that lie or disagree between ranks, rank files
missing, extra, misnamed, truncated or running code.

The set is two ranks written by torch.save of real DTensors, made in a new process on torch's fake
process group (a 2-rank world in one process, no sockets: ~4 s where two gloo ranks take ~30 s);
test_ranks.py reads sets written by two real ranks. Every case goes through the command line and
is held to the same promises (`hostile.refused`): exit 1 or 2, one line naming the file or
set, no traceback, no output or scratch file, an existing target unchanged, no code run, bounded
time and no allocation a header merely claims."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.hostile import refused

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.tensor")

WRITE = """
import sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore
w, b = torch.arange(32.0).reshape(8, 4), torch.arange(4.0)
for rank in range(2):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    def d(local, placement, whole):
        return DTensor.from_local(local.clone(), mesh, [placement], run_check=False, shape=whole.shape,
                                  stride=whole.stride())
    torch.save({"w": d(w[rank * 4:(rank + 1) * 4], Shard(0), w), "v": d(w[:, rank * 2:(rank + 1) * 2], Shard(1), w),
                "b": d(b, Replicate(), b)}, f"{sys.argv[1]}/model_world_size_2_rank_{rank}.pt")
    dist.destroy_process_group()
"""


def rank_file(rank: int, world: int = 2) -> str:
    return f"model_world_size_{world}_rank_{rank}.pt"


Change = Callable[[Path], None]  # edits the set's folder


def edit(rank: int, change: Callable[[dict[str, Any], Path], None]) -> Change:
    """Load rank `rank`'s state dict (the test's own file: torch unpickles it), change it, save it."""
    def run(folder: Path) -> None:
        path = folder / rank_file(rank)
        sd = torch.load(path, weights_only=False)
        change(sd, folder)
        torch.save(sd, path)
    return run


def spec(key: str, field: str, value: Callable[[Any], Any]) -> Callable[[dict[str, Any], Path], None]:
    """Set a DTensor spec's field, bypassing the checks DTensorSpec's constructor would make."""
    def change(sd: dict[str, Any], folder: Path) -> None:
        s = sd[key]._spec
        object.__setattr__(s, field, value(s))
    return change


def local(key: str, tensor: Callable[[], Any]) -> Callable[[dict[str, Any], Path], None]:
    def change(sd: dict[str, Any], folder: Path) -> None:
        object.__setattr__(sd[key], "_local_tensor", tensor())
    return change


def item(key: str, value: Any) -> Callable[[dict[str, Any], Path], None]:
    def change(sd: dict[str, Any], folder: Path) -> None:
        if value is ...:
            del sd[key]
        else:
            sd[key] = value(folder) if callable(value) else value
    return change


def shape(new: list[int]) -> Callable[[Any], Any]:
    return lambda s: s.tensor_meta._replace(shape=torch.Size(new))


def placement(p: Callable[[], Any]) -> Callable[[Any], Any]:
    return lambda s: (p(),)


def files(change: Callable[[Path], None]) -> Change:
    return change


class _System:
    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.sentinel}",))


def _shard(dim: int) -> Any:
    from torch.distributed.tensor import Shard

    return Shard(dim)


def _write(rank: int, data: Callable[[Path], bytes]) -> Change:
    def change(folder: Path) -> None:
        (folder / rank_file(rank)).write_bytes(data(folder))
    return change


def _truncate(rank: int) -> Change:
    def change(folder: Path) -> None:
        path = folder / rank_file(rank)
        os.truncate(path, path.stat().st_size // 2)
    return change


def _rename_all(world: int) -> Change:
    def change(folder: Path) -> None:
        for r in range(2):
            (folder / rank_file(r)).rename(folder / rank_file(r, world))
    return change


def _copy(rank: int, to: str) -> Change:
    def change(folder: Path) -> None:
        (folder / to).write_bytes((folder / rank_file(rank)).read_bytes())
    return change


CASES: dict[str, Change] = {
    "placement past the dimensions": edit(0, spec("w", "placements", placement(lambda: _shard(5)))),
    "placement negative": edit(1, spec("w", "placements", placement(lambda: _shard(-7)))),
    "placements differ between ranks": edit(1, spec("w", "placements", placement(lambda: _shard(1)))),
    "global shape huge": edit(0, spec("b", "tensor_meta", shape([2**40]))),
    "global shape beyond 64 bits": edit(0, spec("w", "tensor_meta", shape([2**62, 2**62, 2**62]))),
    "global shape of other rank": edit(1, spec("w", "tensor_meta", shape([32]))),
    "global shapes differ between ranks": edit(1, spec("w", "tensor_meta", shape([10, 4]))),
    "local shard of other shape": edit(1, local("w", lambda: torch.zeros(3, 4))),
    "local shard of other dtype": edit(1, local("w", lambda: torch.zeros(4, 4, dtype=torch.float64))),
    "replicated shards disagree in shape": edit(1, local("b", lambda: torch.zeros(5))),
    "a plain tensor in one rank": edit(1, item("w", torch.zeros(4, 4))),
    "a key missing in one rank": edit(1, item("v", ...)),
    "an extra key in one rank": edit(1, item("extra", torch.zeros(2))),
    "a rank running os.system": edit(1, item("w", lambda f: _System(f.parent / "ran"))),
    "a rank a bare pickle running os.system": _write(1, lambda f: pickle.dumps({"w": _System(f.parent / "ran")})),
    "a rank empty": _write(1, lambda f: b""),
    "a rank random bytes": _write(0, lambda f: bytes(range(256)) * 4),
    "a rank truncated": _truncate(1),
    "a rank missing": lambda f: (f / rank_file(1)).unlink(),
    "an extra rank": _copy(1, rank_file(2)),
    "a world of three named": _rename_all(3),
    "a world of zero named": _rename_all(0),
    "a rank of another world": _copy(1, rank_file(0, 4)),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ranks")
    done = subprocess.run([sys.executable, "-c", WRITE, str(folder)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def _broken(good: Path, tmp_path: Path, name: str) -> Path:
    folder = tmp_path / "w" / "verl"
    folder.mkdir(parents=True)
    for p in good.iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    CASES[name](folder)
    return folder


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("how", ["folder", "one file"])
def test_hostile_rank_files_are_refused_cleanly(good: Path, tmp_path: Path, name: str, how: str) -> None:
    folder = _broken(good, tmp_path, name)
    src = folder if how == "folder" else sorted(folder.iterdir())[0]
    done = refused(["convert", str(src), str(tmp_path / "w" / "out.safetensors")], tmp_path / "w")
    assert str(folder) in done.stderr, done.stderr  # names the set or its file
    assert not (tmp_path / "w" / "ran").exists()


def test_an_existing_target_survives(good: Path, tmp_path: Path) -> None:
    folder = _broken(good, tmp_path, "global shape huge")
    out = tmp_path / "w" / "out.safetensors"
    out.write_bytes(b"the old model")
    refused(["convert", str(folder), str(out), "--overwrite"], tmp_path / "w")


def test_the_good_set_converts(good: Path, tmp_path: Path) -> None:
    """The corpus's set is sound: each refusal above is the broken part's."""
    import numpy as np

    from migrator.files.io import open_file
    from tests.support.cli import migrate_in_process

    done = migrate_in_process("convert", str(good), str(tmp_path / "out.safetensors"))
    assert done.returncode == 0, done.stderr
    whole = np.arange(32, dtype=np.float32).reshape(8, 4)
    with open_file(tmp_path / "out.safetensors") as r:
        assert np.array_equal(r["w"].numpy(), whole) and np.array_equal(r["v"].numpy(), whole)
        assert np.array_equal(r["b"].numpy(), np.arange(4, dtype=np.float32))

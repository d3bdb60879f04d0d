"""A model and Burn's optimizer record under kill -9 at every step of their publish: both or neither.

The run replaces an existing pair written from another checkpoint with the same tensor table and
step count (the case where ids derived from the checkpoint alone would coincide, so an old record
would apply to a new model). The run stops itself at each named point of `migrator.core.crashpoints`
(`storage/atomic_pair.py` lists them), is looked at, and is killed (SIGKILL): the wait is on the
process's own stop (waitpid with WUNTRACED), never on time.

- before the first rename: both files are the old pair, byte for byte;
- between the two renames (`published:1`): the record is the new one, the model the old one, and
  they are told apart: their stamps differ, the record's param_ids are none of the model's (so Burn's
  `load_record`, which keys state by ParamId, applies none of it), and `inspect` says so;
- after the second rename: both files are the new pair, byte for byte as an uninterrupted run writes.

The next run removes every scratch file the killed ones left. Oracles: the old pair's bytes, a
reference run's bytes, and a burnpack parser written here (cbor2) for the ids and stamps.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.alarm import alarm

torch = pytest.importorskip("torch")
cbor2 = pytest.importorskip("cbor2")

REPO = Path(__file__).resolve().parents[2]
RECIPE = ("version: 1\nsource: {path: ckpt.pt, top_level_key: model}\ntraining_state: keep\n"
          "target: {path: out.bpk, overwrite: true}\n")
FILES = ("out.bpk", "out-optim.bpk")


def checkpoint(path: Path, shift: float) -> None:
    """An AdamW checkpoint after one step; `shift` changes the weights, not the table or the step."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(net.parameters(), foreach=False)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(shift)
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, path)


def run(folder: Path, stop_at: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if stop_at:
        env["MIGRATOR_STOP_AT"] = stop_at
    return subprocess.Popen([sys.executable, "-m", "migrator.cli", "run", "recipe.yaml", "--no-progress"], cwd=folder,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(folder: Path) -> None:
    proc = run(folder)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err


def kill_at(folder: Path, point: str) -> None:
    proc = run(folder, point)
    with alarm(120, f"the run never reached {point}"):
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        proc.returncode = os.waitstatus_to_exitcode(status)
        pytest.fail(f"the run exited ({proc.returncode}) before reaching {point}: {proc.communicate()[1]}")
    proc.kill()
    proc.communicate()


def parse(path: Path) -> tuple[dict[str, str], set[int]]:
    """A burnpack's metadata and the param_ids of its tensors (10-byte header, then CBOR)."""
    data = path.read_bytes()
    assert data[:4] == b"NRUB"
    meta = cbor2.loads(data[10:10 + int.from_bytes(data[6:10], "little")])
    return meta.get("metadata", {}), {d["param_id"] for d in meta["tensors"].values() if "param_id" in d}


def same(folder: Path, other: Path) -> bool:
    return all(filecmp.cmp(folder / f, other / f, shallow=False) for f in FILES)


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path, Path]:
    """work: the old pair (from checkpoint A) and checkpoint B; old: a copy of the old pair;
    ref: B's pair written over a copy of the old pair, uninterrupted."""
    work, old, ref = tmp_path / "work", tmp_path / "old", tmp_path / "ref"
    for f in (work, old, ref):
        f.mkdir()
        (f / "recipe.yaml").write_text(RECIPE)
    checkpoint(work / "ckpt.pt", 0.0)
    finish(work)
    for f in FILES:
        shutil.copy2(work / f, old / f)
        shutil.copy2(work / f, ref / f)
    checkpoint(work / "ckpt.pt", 1.0)
    shutil.copy2(work / "ckpt.pt", ref / "ckpt.pt")
    finish(ref)
    assert not same(ref, old)
    return work, old, ref


def restore(work: Path, old: Path) -> None:
    for f in FILES:
        shutil.copy2(old / f, work / f)


def test_kill_at_every_step_leaves_both_or_neither(folders: tuple[Path, Path, Path]) -> None:
    work, old, ref = folders
    for point in ("scratch-created", "tensor:1", "tensor:3", "written", "synced"):
        kill_at(work, point)
        assert same(work, old), point  # the old pair, whole
    kill_at(work, "published:1")  # between the two renames
    assert filecmp.cmp(work / "out-optim.bpk", ref / "out-optim.bpk", shallow=False)
    assert filecmp.cmp(work / "out.bpk", old / "out.bpk", shallow=False)
    model_meta, model_ids = parse(work / "out.bpk")
    record_meta, record_ids = parse(work / "out-optim.bpk")
    assert model_meta["migrator.pair"] != record_meta["migrator.pair"]
    assert record_ids and not record_ids & model_ids  # Burn applies none of this record to this model
    said = subprocess.run([sys.executable, "-m", "migrator.cli", "inspect", "out.bpk"], cwd=work, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert said.returncode == 0 and "out-optim.bpk is not its pair" in said.stderr, said.stderr
    # left: the model's scratch file, and the old record's aside link (put back on an error, not a kill)
    assert sorted(n.split(".migrator-")[0] for n in os.listdir(work) if ".migrator-" in n) == sorted(FILES)
    for point in ("published", "done"):
        restore(work, old)
        kill_at(work, point)
        assert same(work, ref), point  # the new pair, whole
    restore(work, old)
    kill_at(work, "synced")
    assert sorted(n.split(".migrator-")[0] for n in os.listdir(work) if ".migrator-" in n) == sorted(FILES)
    finish(work)  # removes the scratch files the killed run left
    assert same(work, ref)
    assert sorted(os.listdir(work)) == ["ckpt.pt", *sorted(FILES), "recipe.yaml"]
    model_meta, model_ids = parse(work / "out.bpk")
    record_meta, record_ids = parse(work / "out-optim.bpk")
    assert model_meta["migrator.pair"] == record_meta["migrator.pair"] and record_ids <= model_ids

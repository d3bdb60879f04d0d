"""One `--jobs` worker killed outright (SIGKILL, as the out-of-memory killer does) fails its own job only.

The other jobs, running or still queued, finish; the dead one is reported (text, `--report`); its
scratch file or scratch folder is removed. Synchronisation is by events, never by time: job B's
predicate (recipes' `filter.predicate` is code) opens the write end of one FIFO per other running
job, whose predicates block reading theirs until end-of-file, which comes when B's process is gone
(the kernel closes its descriptors). B then kills itself while writing its third tensor
(`MIGRATOR_KILL_AT=tensor:3`, `migrator.crashpoints`), its scratch on disk; the others write two
tensors each and never reach that point. Oracles: the `safetensors` library's reading of the outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

REPO = Path(__file__).resolve().parents[2]

SYNC = '''
import os

_held = []
_done = set()


def hold(name):
    """Job B: hold the write end of each waiter's FIFO until this process dies."""
    if not _held:
        for fifo in os.environ["JOBSYNC_FIFOS"].split(os.pathsep):
            _held.append(os.open(fifo, os.O_WRONLY))  # returns once that waiter has opened it
    return True


def _wait(fifo):
    if fifo not in _done:
        _done.add(fifo)
        fd = os.open(fifo, os.O_RDONLY)
        while os.read(fd, 1):
            pass
        os.close(fd)
    return True


def wait_a(name):
    return _wait(os.environ["JOBSYNC_DIR"] + "/a.fifo")


def wait_c(name):
    return _wait(os.environ["JOBSYNC_DIR"] + "/c.fifo")


def hold_then_exit(name):
    """Like `hold`, then the process ends at once with code 3 (a crash in a native library, say)."""
    hold(name)
    os._exit(3)
'''


def weights(job: str) -> dict[str, np.ndarray]:
    n = 4 if job == "b" else 2  # only B reaches the third tensor
    rng = np.random.default_rng(ord(job))
    return {f"w{i}": rng.standard_normal((64, 64)).astype(np.float32) for i in range(n)}


def make_job(work: Path, job: str, predicate: str | None, target: str) -> Path:
    """A recipe; a target ending with '/' is a folder of shards (two or more)."""
    save_file(weights(job), str(work / f"{job}.safetensors"))
    filt = f"filter: {{include: [{{predicate: 'jobsync:{predicate}'}}]}}\n" if predicate else ""
    shard = ", shard: {max_size: 20000}" if target.endswith("/") else ""
    path = work / f"{job}.yaml"
    path.write_text(f"version: 1\nsource: {{path: {job}.safetensors}}\n{filt}target: {{path: '{target}'{shard}}}\n")
    return path


def run(work: Path, waiters: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    for w in waiters:
        os.mkfifo(work / f"{w}.fifo")
    (work / "jobsync.py").write_text(SYNC)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(work)]), "MIGRATOR_KILL_AT": "tensor:3",
           "JOBSYNC_DIR": str(work), "JOBSYNC_FIFOS": os.pathsep.join(str(work / f"{w}.fifo") for w in waiters)}
    return subprocess.run([sys.executable, "-m", "migrator.cli", "run", *args, "--no-progress"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)


def check(path: Path, job: str) -> None:
    got, want = load_file(str(path)), weights(job)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def read_folder(folder: Path) -> dict[str, np.ndarray]:
    index = folder / "model.safetensors.index.json"
    got: dict[str, np.ndarray] = {}
    for shard in set(json.loads(index.read_text())["weight_map"].values()):
        got |= load_file(str(folder / shard))
    return got


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if "migrator-" in p.name)


@pytest.mark.parametrize("b_target", ["out/b.safetensors", "out/b/"])
def test_a_killed_worker_fails_only_its_own_job(tmp_path: Path, b_target: str) -> None:
    """Three jobs at once; B (a file, or a folder of shards) is killed mid-write while A and C run."""
    a = make_job(tmp_path, "a", "wait_a", "out/a.safetensors")
    b = make_job(tmp_path, "b", "hold", b_target)
    c = make_job(tmp_path, "c", "wait_c", "out/c.safetensors")
    p = run(tmp_path, ["a", "c"], str(a), str(b), str(c), "--jobs", "3", "--report", "all.json")
    assert p.returncode == 1, p.stdout + p.stderr
    check(tmp_path / "out" / "a.safetensors", "a")
    check(tmp_path / "out" / "c.safetensors", "c")
    assert not (tmp_path / "out" / b_target.rstrip("/").split("/")[-1]).exists()
    assert leftovers(tmp_path) == []  # the dead job's scratch is removed
    assert "b.yaml" in p.stderr and "SIGKILL" in p.stderr, p.stderr
    report = json.loads((tmp_path / "all.json").read_text())
    assert [(j["status"], j["written"]) for j in report["jobs"]] == [("ok", True), ("failed", False), ("ok", True)]
    assert "SIGKILL" in report["jobs"][1]["errors"][0]["message"]
    assert "3 jobs: 2 ok, 1 failed" in p.stdout


def test_queued_jobs_still_run_after_a_worker_is_killed(tmp_path: Path) -> None:
    """Two at a time: while A waits for B's death, D and E are queued; they run afterwards."""
    a = make_job(tmp_path, "a", "wait_a", "out/a.safetensors")
    b = make_job(tmp_path, "b", "hold", "out/b.safetensors")
    d = make_job(tmp_path, "d", None, "out/d.safetensors")
    e = make_job(tmp_path, "e", None, "out/e/")
    p = run(tmp_path, ["a"], str(b), str(a), str(d), str(e), "--jobs", "2", "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert [j["exit_code"] for j in doc["jobs"]] == [1, 0, 0, 0]
    assert doc["jobs"][0]["error"]["kind"] == "WorkerError" and "SIGKILL" in doc["jobs"][0]["error"]["message"]
    for job in "ad":
        check(tmp_path / "out" / f"{job}.safetensors", job)
    got, want = read_folder(tmp_path / "out" / "e"), weights("e")
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
    assert leftovers(tmp_path) == [] and not (tmp_path / "out" / "b.safetensors").exists()


def test_a_worker_that_exits_without_a_result_is_reported(tmp_path: Path) -> None:
    a = make_job(tmp_path, "a", "wait_a", "out/a.safetensors")
    b = make_job(tmp_path, "b", "hold_then_exit", "out/b.safetensors")
    p = run(tmp_path, ["a"], str(a), str(b), "--jobs", "2")
    assert p.returncode == 1, p.stdout + p.stderr
    check(tmp_path / "out" / "a.safetensors", "a")
    assert "b.yaml did not finish: its worker process exited with code 3" in p.stderr.replace(str(tmp_path) + "/", "")
    assert "2 jobs: 1 ok, 1 failed" in p.stdout


def run_pinned(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`migrate run ARGS` on one CPU (its affinity mask: a loaded machine, a container given one CPU),
    so the default --jobs is 1; B kills itself at its third tensor as above."""
    cpu = min(os.sched_getaffinity(0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "MIGRATOR_KILL_AT": "tensor:3"}
    return subprocess.run([sys.executable, "-m", "migrator.cli", "run", *args, "--no-progress"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)")
@pytest.mark.parametrize("jobs", [[], ["--jobs", "1"]], ids=["default-on-one-cpu", "jobs-1"])
def test_one_job_at_a_time_a_killed_job_costs_no_other_job(tmp_path: Path, jobs: list[str]) -> None:
    """One at a time (`--jobs 1`, and the default where this process may use one CPU), the jobs ran in
    the `migrate` process itself: B's SIGKILL ended the run, and C, after it, never ran. Each job has
    a worker process of its own now; the order is kept, no synchronisation is needed."""
    a = make_job(tmp_path, "a", None, "out/a.safetensors")
    b = make_job(tmp_path, "b", None, "out/b.safetensors")
    c = make_job(tmp_path, "c", None, "out/c/")
    p = run_pinned(tmp_path, str(a), str(b), str(c), *jobs, "--report", "all.json")
    assert p.returncode == 1, p.stdout + p.stderr
    check(tmp_path / "out" / "a.safetensors", "a")
    got, want = read_folder(tmp_path / "out" / "c"), weights("c")
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
    assert not (tmp_path / "out" / "b.safetensors").exists() and leftovers(tmp_path) == []
    assert "b.yaml did not finish" in p.stderr and "SIGKILL" in p.stderr, p.stderr
    lines = [line.replace(str(tmp_path) + "/", "") for line in p.stdout.splitlines() if line.startswith("[")]
    assert lines == ["[1/3] a.yaml", "[2/3] b.yaml", "[3/3] c.yaml"], p.stdout  # each heading before its job
    assert "3 jobs: 2 ok, 1 failed" in p.stdout
    report = json.loads((tmp_path / "all.json").read_text())
    assert [j["status"] for j in report["jobs"]] == ["ok", "failed", "ok"]


def test_a_killed_job_writing_a_burn_pair_leaves_neither_scratch_file(tmp_path: Path) -> None:
    """B writes a model and Burn's optimizer record (its four moments, then the model's two tensors);
    killed at its fifth tensor, both scratch files exist, the record's whole. Both are removed, and A
    and C, one at a time after and before it, are written."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(net.parameters(), foreach=False)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "b.pt")
    (tmp_path / "b.yaml").write_text("version: 1\nsource: {path: b.pt, top_level_key: model}\ntraining_state: keep\n"
                                     "target: {path: out/b.bpk}\n")
    a = make_job(tmp_path, "a", None, "out/a.safetensors")
    c = make_job(tmp_path, "c", None, "out/c.safetensors")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MIGRATOR_KILL_AT": "tensor:5"}
    p = subprocess.run([sys.executable, "-m", "migrator.cli", "run", str(a), str(tmp_path / "b.yaml"), str(c),
                        "--jobs", "1", "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1 and "SIGKILL" in p.stderr, p.stdout + p.stderr
    check(tmp_path / "out" / "a.safetensors", "a")
    check(tmp_path / "out" / "c.safetensors", "c")
    assert sorted(os.listdir(tmp_path / "out")) == ["a.safetensors", "c.safetensors"]  # no model, record, scratch

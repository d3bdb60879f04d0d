"""Atomic output: the old target survives exceptions, kill -9, a full disk and races."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, open_file, save
from migrator.atomic import SCRATCH_RE, atomic_output, clean_stale_scratch, scratch_name
from migrator.errors import OutputError, TargetExistsError

SLOW_WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from migrator import dtypes, save
    from migrator.tensor import LazyTensor

    def slow(i):
        def load():
            time.sleep(0.02)
            return np.full(4096, i, np.float32).tobytes()
        return LazyTensor(f"t{i}", dtypes.F32, (4096,), 4096 * 4, load)

    print("start", flush=True)
    save([slow(i) for i in range(40)], sys.argv[1], overwrite=True, fsync=sys.argv[2] == "fsync")
    print("done", flush=True)
""")


def _old_target(path: Path) -> bytes:
    save([from_numpy("old", np.arange(10, dtype=np.float32))], path, overwrite=True)
    return path.read_bytes()


def _assert_old_or_complete_new(path: Path, old: bytes) -> str:
    data = path.read_bytes()
    if data == old:
        return "old"
    r = open_file(path)
    assert r.names() == [f"t{i}" for i in range(40)]
    for i, t in enumerate(r.tensors):
        assert (t.numpy() == i).all()
    return "new"


@pytest.mark.parametrize("fsync", ["fsync", "no-fsync"])
def test_sigkill_at_random_moments_never_leaves_a_partial_target(tmp_path: Path, fsync: str) -> None:
    target = tmp_path / "model.bpk"
    old = _old_target(target)
    rng = random.Random(1234)
    outcomes = []
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(target), fsync], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.readline()  # imports done, writing starts
        time.sleep(rng.uniform(0.0, 1.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        outcomes.append(_assert_old_or_complete_new(target, old))
        if outcomes[-1] == "new":
            old = target.read_bytes()
    leftovers = [p for p in tmp_path.iterdir() if p.name != "model.bpk"]
    assert all(SCRATCH_RE.match(p.name) for p in leftovers), leftovers
    assert "old" in outcomes  # at least one kill landed mid-write
    # The next write removes the scratch files of the dead writers.
    save([from_numpy("w", np.ones(2, np.float32))], target, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["model.bpk"]


@pytest.mark.parametrize("fsync", [True, False])
def test_fsync_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool) -> None:
    """Durable by default: the file and its folder are fsynced and writeback starts early;
    fsync=False does neither, and still publishes a complete file under the target name."""
    synced: list[str] = []
    advised: list[int] = []
    real_fsync, real_fadvise = os.fsync, os.posix_fadvise

    def spy_fsync(fd: int) -> None:
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    def spy_fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append(length)
        real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "posix_fadvise", spy_fadvise)
    arrays = [np.full(9 << 20, i, np.float32) for i in range(3)]  # 108 MiB: several 32 MiB writeback steps
    target = tmp_path / "m.safetensors"
    save([from_numpy(f"t{i}", a) for i, a in enumerate(arrays)], target, fsync=fsync)
    assert synced == (["file", "dir"] if fsync else [])
    assert (sum(advised) >= 96 << 20) if fsync else advised == []
    r = open_file(target)
    assert [int(t.numpy()[0]) for t in r.tensors] == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


def test_full_disk_keeps_target_and_leaves_no_scratch(tmp_path: Path) -> None:
    target = tmp_path / "model.bpk"
    old = _old_target(target)
    script = textwrap.dedent("""
        import resource, signal, sys
        import numpy as np
        from migrator import from_numpy, save
        from migrator.errors import OutputError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        try:
            save([from_numpy("big", np.ones(1_000_000, np.float32))], sys.argv[1], overwrite=True)
        except OutputError as e:
            print("ERROR", e)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True, text=True, check=True)
    assert "ERROR" in out.stdout and str(target) in out.stdout and "space" in out.stdout, out
    assert target.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["model.bpk"]


def test_concurrent_writers_leave_one_complete_file(tmp_path: Path) -> None:
    target = tmp_path / "model.bpk"
    old = _old_target(target)
    procs = [subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(target), "fsync"], stdout=subprocess.DEVNULL)
             for _ in range(2)]
    for p in procs:
        assert p.wait() == 0
    assert _assert_old_or_complete_new(target, old) == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bpk"]


def test_target_appearing_during_write_is_not_clobbered(tmp_path: Path) -> None:
    target = tmp_path / "out.bpk"
    with pytest.raises(TargetExistsError, match="appeared while writing"), atomic_output(target) as f:
        f.write(b"new")
        target.write_bytes(b"someone else's")
    assert target.read_bytes() == b"someone else's"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bpk"]


def test_exception_inside_body_removes_scratch(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"keep")
    with pytest.raises(RuntimeError), atomic_output(target, overwrite=True) as f:
        f.write(b"partial")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"keep"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_size_mismatch_against_plan_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="planned 10"), atomic_output(tmp_path / "x", expected_size=10) as f:
        f.write(b"short")
    assert list(tmp_path.iterdir()) == []


def test_target_folder_or_directory_errors(tmp_path: Path) -> None:
    (tmp_path / "adir.bpk").mkdir()
    with pytest.raises(OutputError, match="folder"):
        save([from_numpy("w", np.ones(2, np.float32))], tmp_path / "adir.bpk", overwrite=True)
    with pytest.raises(OutputError, match="does not exist"):
        save([from_numpy("w", np.ones(2, np.float32))], tmp_path / "missing" / "x.bpk")


def test_symlink_target_is_replaced_not_followed(tmp_path: Path) -> None:
    real = tmp_path / "real.bin"
    real.write_bytes(b"untouched")
    link = tmp_path / "link.bpk"
    link.symlink_to(real)
    save([from_numpy("w", np.ones(2, np.float32))], link, overwrite=True)
    assert real.read_bytes() == b"untouched"
    assert not link.is_symlink() and open_file(link).names() == ["w"]


def test_stale_scratch_of_dead_process_is_cleaned_live_one_kept(tmp_path: Path) -> None:
    target = tmp_path / "m.bpk"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = scratch_name(target, dead.pid, 0)
    live = scratch_name(target, os.getppid(), 0)
    other = scratch_name(tmp_path / "other.bpk", dead.pid, 0)
    for p in (stale, live, other):
        p.write_bytes(b"x")
    assert clean_stale_scratch(target) == [stale]
    assert live.exists() and other.exists() and not stale.exists()

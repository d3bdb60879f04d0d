"""Atomic output: the old target survives exceptions, kill -9, a full disk and races."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, open_file, save
from migrator.core.errors import OutputError, TargetExistsError
from migrator.storage.atomic import atomic_output, clean_stale_scratch, scratch_name

# A writer of 40 tensors that pauses in the loader of each: it prints "load i" and waits for a line on
# stdin, so the test decides exactly how far the write has got when it kills the process.
STEPPED_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from migrator import save
    from migrator.core import dtypes
    from migrator.core.tensor import LazyTensor

    def stepped(i):
        def load():
            print("load", i, flush=True)
            sys.stdin.readline()
            return np.full(4096, i, np.float32).tobytes()
        return LazyTensor(f"t{i}", dtypes.F32, (4096,), 4096 * 4, load)

    save([stepped(i) for i in range(40)], sys.argv[1], overwrite=True, fsync=sys.argv[2] == "fsync")
    print("done", flush=True)
""")


def stepped_writer(target: Path, fsync: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", STEPPED_WRITER, str(target), fsync], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def step(proc: subprocess.Popen[str]) -> str:
    """Let `proc` load one tensor; return its next line ("load i" or "done")."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def _old_target(path: Path) -> bytes:
    save([from_numpy("old", np.arange(10, dtype=np.float32))], path, overwrite=True)
    return path.read_bytes()


def _assert_complete_new(path: Path) -> None:
    r = open_file(path)
    assert r.names() == [f"t{i}" for i in range(40)]
    for i, t in enumerate(r.tensors):
        assert (t.numpy() == i).all()


@pytest.mark.parametrize("fsync", ["fsync", "no-fsync"])
def test_sigkill_mid_write_never_leaves_a_partial_target(tmp_path: Path, fsync: str) -> None:
    """SIGKILL while the writer waits in the loader of tensor k: the old target stays, whole."""
    target = tmp_path / "model.bpk"
    old = _old_target(target)
    for k in (0, 1, 17, 39):
        proc = stepped_writer(target, fsync)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # the first loader runs: the scratch file is open
        while line != f"load {k}":
            assert line.startswith("load"), line
            line = step(proc)
        proc.kill()
        proc.communicate()
        assert target.read_bytes() == old, f"killed while loading tensor {k}: the target changed"
        # the dead run's scratch file stays; the one before it was removed when this run started writing
        scratch = scratch_name(target, proc.pid, 0)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model.bpk", scratch.name])
    # A run let through to the end publishes the complete new file, and removed the dead run's scratch.
    proc = stepped_writer(target, fsync)
    assert proc.stdout is not None
    lines = [proc.stdout.readline().strip()] + [step(proc) for _ in range(40)]
    proc.communicate()
    assert lines == [f"load {i}" for i in range(40)] + ["done"]
    assert proc.returncode == 0
    _assert_complete_new(target)
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
        from migrator.core.errors import OutputError
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
    """Two writers of one target, stepped in turn so that both are mid-write at once."""
    target = tmp_path / "model.bpk"
    _old_target(target)
    procs = [stepped_writer(target, "fsync") for _ in range(2)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "load 0"
    assert all(scratch_name(target, p.pid, 0).exists() for p in procs)
    for i in range(1, 41):
        assert [step(p) for p in procs] == [f"load {i}" if i < 40 else "done"] * 2
    for p in procs:
        p.communicate()
    assert [p.returncode for p in procs] == [0, 0]
    _assert_complete_new(target)
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

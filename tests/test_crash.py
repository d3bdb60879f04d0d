"""`migrate run` under crashes, full disks, read-only folders and races: existing files survive.

A real recipe (SafeTensors -> burnpack with `dtype: {cast: F16}`, so the data is computed, not
copied in the kernel) writes ~100 MB through `python -m migrator.cli run`:

* SIGKILL with the scratch file part-written (the run is stopped with SIGSTOP at chosen points
  and looked at before the kill): the target is the old file, the run's scratch file is the only
  other file; SIGKILL at moments spread over whole runs: the target is the old file or byte for
  byte the complete new one (the output is reproducible, so it is compared with a reference run);
  the next run removes the scratch files the killed ones left;
* a full disk (a small tmpfs, when this process may mount one; RLIMIT_FSIZE otherwise and as
  well): a clear error, the target intact, no scratch file left;
* a read-only target folder: a clear error naming the target, the target intact;
* two runs writing one target at once: one complete file (with and without overwrite).
"""

from __future__ import annotations

import contextlib
import ctypes
import filecmp
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from migrator import dtypes, from_numpy, open_file, save
from migrator.atomic import SCRATCH_RE

RANDOM_KILLS = 12
ROWS, COLS, LAYERS = 1024, 4096, 12  # 12 x 16 MiB of F32 in, 12 x 8 MiB of F16 out (~100 MB written)
PAGE = 4096
SAMPLES = 48  # pages of the output compared, spread over the whole file
SAFETY_TIMEOUT = 120  # seconds; only a hung run gets near it


def recipe_text(target: str, *, overwrite: bool = True, tag: str | None = None, source: str = "src.safetensors") -> str:
    meta = f"\n  metadata: {{run: {tag}}}" if tag else ""
    return (f"version: 1\nsource: {{path: {source}}}\ndtype: {{cast: F16}}\n"
            f"target:\n  path: {target}\n  overwrite: {str(overwrite).lower()}{meta}\n")


def run_cli(recipe: Path, *, preexec: Callable[[], None] | None = None, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "migrator.cli", "run", str(recipe), "--no-progress"],
                            cwd=recipe.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=preexec, **kwargs)  # type: ignore[call-overload]


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the ~200 MB F32 source (made once for the module)."""
    folder = tmp_path_factory.mktemp("crash")
    rng = np.random.default_rng(0)
    tensors = [from_numpy(f"layers.{i}.weight", rng.random((ROWS, COLS), dtype=np.float32)) for i in range(LAYERS)]
    save(tensors, folder / "src.safetensors")
    return folder


def old_target(path: Path) -> bytes:
    save([from_numpy("old", np.arange(10, dtype=np.float32))], path, overwrite=True)
    return path.read_bytes()


def scratch_files(folder: Path, target: str) -> list[str]:
    return [n for n in os.listdir(folder) if (m := SCRATCH_RE.match(n)) and m["target"] == target]


def reference(workdir: Path, recipe: Path, target: Path, keep: Path) -> float:
    """Run `recipe` to completion; keep its output under `keep` (a hard link); return the time taken."""
    started = time.monotonic()
    code, err = finish(run_cli(recipe))
    assert code == 0, err
    elapsed = time.monotonic() - started
    with contextlib.suppress(FileNotFoundError):
        keep.unlink()
    os.link(target, keep)
    return elapsed


class Progress:
    """How much of the reference output a scratch file already holds, from pages sampled across it.

    The scratch file is reserved at its full size up front, so its size says nothing; a sampled page
    counts as written when it equals the reference's (none of which is all zeros, as reserved space is).
    """

    def __init__(self, ref: Path) -> None:
        size = ref.stat().st_size
        self.offsets = [size * i // SAMPLES // PAGE * PAGE for i in range(SAMPLES)]
        with open(ref, "rb") as f:
            self.pages = [os.pread(f.fileno(), PAGE, o) for o in self.offsets]
        assert all(p.count(0) < len(p) for p in self.pages)

    def __call__(self, scratch: Path) -> float | None:
        """The fraction of sampled pages written; None when there is no scratch file."""
        try:
            fd = os.open(scratch, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return sum(os.pread(fd, PAGE, o) == p for o, p in zip(self.offsets, self.pages, strict=True)) / SAMPLES
        finally:
            os.close(fd)


def stop(proc: subprocess.Popen[str]) -> bool:
    """SIGSTOP `proc` and wait until all its threads have stopped; False when it exited first."""
    os.kill(proc.pid, signal.SIGSTOP)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        return True
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return False


def kill_part_written(recipe: Path, progress: Progress, at: float) -> tuple[int, float]:
    """Start a run and SIGKILL it once its scratch file holds at least `at` of the output but not all.

    Every look is taken while the run is stopped, so the state seen is the state the kill leaves. A
    run that gets past the window between two looks (~1 ms of its time: the whole write takes far
    longer) is replaced by a new one. Returns the killed run's pid and the fraction it had written.
    """
    deadline = time.monotonic() + SAFETY_TIMEOUT
    while time.monotonic() < deadline:
        proc = run_cli(recipe)
        scratch = recipe.parent / f"out.bpk.migrator-{proc.pid}-0.tmp"
        seen = False
        while time.monotonic() < deadline and stop(proc):
            done = progress(scratch)
            seen |= done is not None
            if done is not None and done >= at:
                proc.kill()
                proc.communicate()
                if done < 1:
                    return proc.pid, done
                break  # wrote everything between two looks: try again
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.001)
        else:
            if proc.returncode is None:  # the deadline passed
                proc.kill()
            code, err = finish(proc)
            assert code in (0, -signal.SIGKILL), err
            assert seen, f"the run finished, and no look saw its scratch file {scratch.name}"
    pytest.fail(f"no run was caught with {at:.0%}-100% of its output written within {SAFETY_TIMEOUT} s")


def check_after_kill(folder: Path, target: Path, old: bytes, ref: Path, killed: list[int]) -> str:
    """What killed runs may leave: the old target or the complete new one, and one scratch file.

    Each run removes the dead runs' scratch files before it writes, so at most one remains: the last
    killed run's, or an earlier one's when the last was killed before it got that far.
    """
    leftovers = sorted(set(os.listdir(folder)) - {"out.bpk", "src.safetensors", "recipe.yaml"})
    assert len(leftovers) <= 1 and set(leftovers) <= {f"out.bpk.migrator-{pid}-0.tmp" for pid in killed}, leftovers
    if target.stat().st_size == len(old) and target.read_bytes() == old:
        return "old"
    assert filecmp.cmp(target, ref, shallow=False), "the target is neither the old file nor the complete new one"
    return "new"


@pytest.mark.slow
def test_sigkill_of_migrate_run_leaves_the_old_target_or_the_new_one(workdir: Path) -> None:
    folder = workdir / "kill"
    folder.mkdir()
    os.link(workdir / "src.safetensors", folder / "src.safetensors")
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe_text("out.bpk"))
    target, ref = folder / "out.bpk", workdir / "kill-reference.bpk"
    duration = reference(workdir, recipe, target, ref)
    with open_file(ref) as r:
        assert len(r) == LAYERS and {t.dtype for t in r.tensors} == {dtypes.F16}
        assert r.source.size > 100_000_000
    old = old_target(target)
    progress = Progress(ref)
    # Killed with the scratch file part-written, at chosen points: the old target stays.
    killed: list[int] = []
    part_written: list[float] = []
    for at in (0.0, 0.3, 0.6, 0.9):
        pid, done = kill_part_written(recipe, progress, at)
        killed.append(pid)
        part_written.append(done)
        assert check_after_kill(folder, target, old, ref, killed) == "old", done
        assert scratch_files(folder, "out.bpk") == [f"out.bpk.migrator-{pid}-0.tmp"], done
    # Killed at moments spread over a whole run (start-up, writing, fsync, rename, clean-up), whatever
    # they hit: the target is always whole, old or new.
    rng = random.Random(2026)
    outcomes: list[str] = []
    for _ in range(RANDOM_KILLS):
        proc = run_cli(recipe)
        time.sleep(rng.uniform(0, duration * 1.05))
        proc.kill()
        proc.communicate()
        killed.append(proc.pid)
        outcomes.append(check_after_kill(folder, target, old, ref, killed))
        if outcomes[-1] == "new":
            old_target(target)  # back to the old file, so the next kill tests a replacement again
    # The next run removes what the killed ones left behind.
    code, err = finish(run_cli(recipe))
    assert code == 0, err
    assert sorted(os.listdir(folder)) == ["out.bpk", "recipe.yaml", "src.safetensors"]
    assert filecmp.cmp(target, ref, shallow=False)
    print(f"killed with {', '.join(f'{d:.0%}' for d in part_written)} written; {RANDOM_KILLS} kills at random "
          f"moments: {outcomes.count('old')} old, {outcomes.count('new')} new")


# ----------------------------------------------------------------------------------------------
# full disk


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True).returncode == 0
    if not mounted:
        path.rmdir()
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission); RLIMIT_FSIZE covers it")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.fixture
def small_source(tmp_path: Path) -> Path:
    """32 MiB of F32 -> 16 MiB of F16 written."""
    save([from_numpy(f"w{i}", np.full((1024, 1024), i, np.float32)) for i in range(8)], tmp_path / "src.safetensors")
    return tmp_path / "src.safetensors"


def test_full_disk_tmpfs(tmp_path: Path, small_source: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "8m") as disk:
        target = disk / "out.bpk"
        old = old_target(target)
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(recipe_text(str(target)))
        code, err = finish(run_cli(recipe))
        assert code == 1, err
        assert str(target) in err and "space" in err, err
        assert "Traceback" not in err
        assert target.read_bytes() == old
        assert os.listdir(disk) == ["out.bpk"]


def _fsize_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_full_disk_rlimit_fsize(tmp_path: Path, small_source: Path) -> None:
    """RLIMIT_FSIZE: writes past 1 MiB fail with EFBIG, as a full disk fails with ENOSPC."""
    target = tmp_path / "out.bpk"
    old = old_target(target)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text("out.bpk"))
    code, err = finish(run_cli(recipe, preexec=_fsize_limit(1 << 20)))
    assert code == 1, err
    assert str(target) in err and "space" in err and "Traceback" not in err, err
    assert target.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == ["out.bpk", "recipe.yaml", "src.safetensors"]


# ----------------------------------------------------------------------------------------------
# read-only target folder


def _without_dac_override() -> None:
    """As root, chmod does not stop writes: drop the capabilities that bypass permissions.

    (Switching to uid 65534 is not possible here: the interpreter lives under /root, mode 0700.)
    """
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: gone from the exec'd process too
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_read_only_target_folder(tmp_path: Path, small_source: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    target = folder / "out.bpk"
    old = old_target(target)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text("ro/out.bpk"))
    folder.chmod(0o555)
    try:
        code, err = finish(run_cli(recipe, preexec=_without_dac_override if os.geteuid() == 0 else None))
    except subprocess.SubprocessError as e:  # prctl refused (no CAP_SETPCAP in this container)
        pytest.skip(f"cannot drop CAP_DAC_OVERRIDE for the child: {e}")
    finally:
        folder.chmod(0o755)
    assert code == 1, err
    assert str(target) in err and "Permission denied" in err and "Traceback" not in err, err
    assert f"in folder {folder}" in err and "not writable" in err, err
    assert target.read_bytes() == old
    assert os.listdir(folder) == ["out.bpk"]


def test_read_only_file_system(tmp_path: Path, small_source: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        target = disk / "out.bpk"
        old = old_target(target)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(recipe_text(str(target)))
        code, err = finish(run_cli(recipe))
        assert code == 1, err
        assert str(target) in err and "Read-only file system" in err and "not writable" in err, err
        assert target.read_bytes() == old
        assert os.listdir(disk) == ["out.bpk"]


# ----------------------------------------------------------------------------------------------
# two runs, one target


@pytest.mark.slow
def test_two_runs_writing_one_target(workdir: Path) -> None:
    folder = workdir / "race"
    folder.mkdir()
    os.link(workdir / "src.safetensors", folder / "src.safetensors")
    target = folder / "out.bpk"
    recipes, refs = [], []
    for tag in ("one", "two"):
        recipe = folder / f"{tag}.yaml"
        recipe.write_text(recipe_text("out.bpk", tag=tag))
        ref = workdir / f"race-{tag}.bpk"
        reference(workdir, recipe, target, ref)
        recipes.append(recipe)
        refs.append(ref)
    assert not filecmp.cmp(refs[0], refs[1], shallow=False)  # the two outputs differ (metadata)

    # overwrite: both succeed, the last publish wins, and it is whole
    old_target(target)
    procs = [run_cli(r) for r in recipes]
    assert [finish(p)[0] for p in procs] == [0, 0]
    assert any(filecmp.cmp(target, ref, shallow=False) for ref in refs)
    assert sorted(os.listdir(folder)) == ["one.yaml", "out.bpk", "src.safetensors", "two.yaml"]

    # no overwrite: exactly one run publishes, the other refuses (and neither clobbers)
    for r in recipes:
        r.write_text(r.read_text().replace("overwrite: true", "overwrite: false"))
    target.unlink()
    procs = [run_cli(r) for r in recipes]
    results = [finish(p) for p in procs]
    codes = [c for c, _ in results]
    assert sorted(codes) == [0, 1], results
    winner = codes.index(0)
    loser_err = results[1 - winner][1]
    assert "exists" in loser_err or "appeared while writing" in loser_err, loser_err
    # the winner's bytes, whole (its recipe text changed, so compare everything but the recipe hash)
    with open_file(target) as r, open_file(refs[winner]) as ref:
        assert r.names() == ref.names()
        assert r.metadata["run"] == ("one", "two")[winner]
        assert all(bytes(a.data()) == bytes(b.data()) for a, b in zip(r.tensors, ref.tensors, strict=True))
    assert sorted(os.listdir(folder)) == ["one.yaml", "out.bpk", "src.safetensors", "two.yaml"]
    shutil.rmtree(folder)

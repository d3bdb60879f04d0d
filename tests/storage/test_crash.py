"""`migrate run` under crashes, full disks, read-only folders and races: existing files survive.

A real recipe (SafeTensors -> burnpack with `dtype: {cast: F16}`, so the data is computed, not
copied in the kernel) writes ~100 MB through `python -m migrator.cli run`:

* SIGKILL at each stage of the write (the run stops itself with SIGSTOP at a named point of
  migrator/core/crashpoints.py, is looked at, then killed): from the scratch file's creation through
  part-written, fully written and synced, the target is the old file and the run's scratch file
  the only other file; once published, the target is byte for byte the complete new one (the
  output is reproducible, so it is compared with a reference run); the next run removes the
  scratch files the killed ones left;
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
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, open_file, save
from migrator.core import dtypes
from migrator.storage.atomic import SCRATCH_RE
from tests.support.alarm import alarm as bounded

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


def reference(recipe: Path, target: Path, keep: Path) -> None:
    """Run `recipe` to completion; keep its output under `keep` (a hard link)."""
    code, err = finish(run_cli(recipe))
    assert code == 0, err
    with contextlib.suppress(FileNotFoundError):
        keep.unlink()
    os.link(target, keep)


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


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """Fail instead of hanging when a run never reaches the point it should stop at."""
    with bounded(seconds, f"no stop or exit within {seconds} s"):
        yield


def kill_at(recipe: Path, point: str) -> int:
    """Start a run that stops itself at `point` (migrator/core/crashpoints.py), wait until it has, SIGKILL it.

    The wait is on the process's own state change (waitpid with WUNTRACED): whatever the machine's
    load, the run is killed exactly there. Returns the killed run's pid.
    """
    proc = run_cli(recipe, env={**os.environ, "MIGRATOR_STOP_AT": point})
    with alarm(SAFETY_TIMEOUT):
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        proc.returncode = os.waitstatus_to_exitcode(status)
        pytest.fail(f"the run exited ({proc.returncode}) before reaching {point}: {proc.communicate()[1]}")
    proc.kill()
    proc.communicate()
    return proc.pid


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


# Where a run is killed, and what the target must be then: the old file until the new one is published.
BEFORE_PUBLISH = ("scratch-created", "tensor:1", f"tensor:{LAYERS // 3}", f"tensor:{2 * LAYERS // 3}",
                  f"tensor:{LAYERS - 1}", "written", "synced")
AFTER_PUBLISH = ("published", "done")


@pytest.mark.slow
def test_sigkill_of_migrate_run_leaves_the_old_target_or_the_new_one(workdir: Path) -> None:
    folder = workdir / "kill"
    folder.mkdir()
    os.link(workdir / "src.safetensors", folder / "src.safetensors")
    recipe = folder / "recipe.yaml"
    recipe.write_text(recipe_text("out.bpk"))
    target, ref = folder / "out.bpk", workdir / "kill-reference.bpk"
    reference(recipe, target, ref)
    with open_file(ref) as r:
        assert len(r) == LAYERS and {t.dtype for t in r.tensors} == {dtypes.F16}
        assert r.source.size > 100_000_000
    old = old_target(target)
    progress = Progress(ref)
    killed: list[int] = []
    written: list[float] = []
    for point in BEFORE_PUBLISH:
        pid = kill_at(recipe, point)
        killed.append(pid)
        scratch = folder / f"out.bpk.migrator-{pid}-0.tmp"
        done = progress(scratch)
        assert done is not None, f"{point}: no scratch file"
        written.append(done)
        assert check_after_kill(folder, target, old, ref, killed) == "old", point
        assert scratch_files(folder, "out.bpk") == [scratch.name], point
    # The scratch file fills up point by point: each kill really hit a different stage of the write.
    assert written[0] == 0 and 0 < written[2] < written[4] < 1 and written[-1] == 1, written
    for point in AFTER_PUBLISH:
        killed.append(kill_at(recipe, point))
        assert check_after_kill(folder, target, old, ref, killed) == "new", point
        old_target(target)  # back to the old file, so the next kill tests a replacement again
    # The next run removes what the killed ones left behind.
    code, err = finish(run_cli(recipe))
    assert code == 0, err
    assert sorted(os.listdir(folder)) == ["out.bpk", "recipe.yaml", "src.safetensors"]
    assert filecmp.cmp(target, ref, shallow=False)


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
        reference(recipe, target, ref)
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

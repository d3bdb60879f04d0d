"""A sharded output under SIGKILL: the target folder is absent / the old one complete, or the new one complete.

`migrate convert SRC OUT/ --max-shard-size 1MiB --copy config.json` writes 10 shards, an index and a
companion file. The test kills it after the k-th file appears in its scratch folder (k cycling from
0, the empty scratch folder, to every file written), with and without an old folder to replace,
and checks the target against complete reference folders byte for byte. No timing is asserted:
where the kill lands after the k-th file is whatever it is, and every landing must be safe.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, save
from migrator.storage.atomic_folder import SCRATCH_DIR_RE

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
KILLS = 30
SHARDS = 10


def convert(work: Path, target: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "migrator.cli", "convert", "src/model.safetensors", target,
                             "--copy", "config.json", "--no-progress", *extra], cwd=work, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def same_folder(a: Path, b: Path) -> bool:
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors


def scratch_dirs(work: Path, target: str) -> list[Path]:
    return [work / n for n in os.listdir(work) if (m := SCRATCH_DIR_RE.match(n)) and m["target"] == target]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("folder-crash")
    (work / "src").mkdir()
    rng = np.random.default_rng(0)
    save([from_numpy(f"layers.{i}.weight", rng.random((512, 512), dtype=np.float32)) for i in range(SHARDS)],
         work / "src" / "model.safetensors")  # 1 MiB each: one per 1MiB shard
    (work / "src" / "config.json").write_text('{"model_type": "test"}\n')
    for name, size in (("new", "1MiB"), ("old", "3MiB")):
        p = convert(work, f"ref-{name}/", "--max-shard-size", size)
        assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
    assert len(list((work / "ref-new").glob("model-*.safetensors"))) == SHARDS
    return work


def _kill_after(work: Path, proc: subprocess.Popen[bytes], target: str, k: int, watch_target: bool) -> bool:
    """SIGKILL `proc` once its scratch folder (or, with `watch_target`, the target itself: a writer that
    is not atomic fills it directly) holds k files; False if it finished first."""
    while proc.poll() is None:
        for d in scratch_dirs(work, target) + ([work / target] if watch_target else []):
            try:
                n = len(os.listdir(d))
            except OSError:  # renamed or removed meanwhile
                continue
            if n >= k:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=60)
                return True
    return False


@pytest.mark.parametrize("overwrite", [False, True])
def test_sigkill_never_leaves_a_mixed_folder(work: Path, overwrite: bool) -> None:
    target = f"out-{overwrite}"
    out = work / target
    kills = attempts = 0
    while kills < KILLS // 2 and attempts < 10 * KILLS:
        attempts += 1
        shutil.rmtree(out, ignore_errors=True)
        if overwrite:
            shutil.copytree(work / "ref-old", out)
        proc = convert(work, target + "/", "--max-shard-size", "1MiB", *(["--overwrite"] if overwrite else []))
        k = kills % (SHARDS + 3)  # 0 (empty scratch) .. every shard, the index and config.json
        killed = _kill_after(work, proc, target, k, watch_target=not overwrite)
        kills += killed
        if not out.exists():
            assert not overwrite, "the old folder vanished"
        elif overwrite and same_folder(out, work / "ref-old"):
            pass
        else:
            assert same_folder(out, work / "ref-new"), sorted(os.listdir(out))
        if not killed:
            assert proc.returncode == 0
    assert kills == KILLS // 2
    # the next run cleans what the dead runs left, and writes the complete folder
    shutil.rmtree(out, ignore_errors=True)
    proc = convert(work, target + "/", "--max-shard-size", "1MiB")
    assert proc.wait(timeout=120) == 0
    assert same_folder(out, work / "ref-new")
    assert scratch_dirs(work, target) == []


def _small_files() -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))


@pytest.mark.parametrize("overwrite", [False, True])
def test_full_disk_leaves_the_target_as_it_was(work: Path, overwrite: bool) -> None:
    """Files over 3 MiB fail (RLIMIT_FSIZE, the full-disk stand-in any process can set): the old
    folder or no folder, and no scratch folder left."""
    target = f"full-{overwrite}"
    out = work / target
    shutil.rmtree(out, ignore_errors=True)
    if overwrite:
        shutil.copytree(work / "ref-old", out)
    proc = subprocess.Popen([sys.executable, "-m", "migrator.cli", "convert", "src/model.safetensors", target + "/",
                             "--max-shard-size", "4MiB", "--copy", "config.json", "--no-progress",
                             *(["--overwrite"] if overwrite else [])],
                            cwd=work, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_small_files)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert b"File too large" in err or b"not enough space" in err
    if overwrite:
        assert same_folder(out, work / "ref-old")
    else:
        assert not out.exists()
    assert scratch_dirs(work, target) == []

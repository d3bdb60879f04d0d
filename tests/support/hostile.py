"""The promises every hostile-input case is held to, checked the same way for every surface (GGUF,
tokenizers, PEFT adapters, mergekit configs, training checkpoints): `migrate` run in process on a
broken input exits 1 (data) or 2 (usage) with one line on stderr and no traceback, writes nothing
(no target, no scratch file, no stray file anywhere under the watched folder), leaves an existing
target byte for byte as it was, and ends within a bound (SIGALRM: a hang fails, it is not timed)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from tests.support.alarm import alarm
from tests.support.cli import migrate_in_process


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under `root`: relative path -> content hash ('dir' for a folder)."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "link:" + str(p.readlink())
        elif p.is_dir():
            out[rel] = "dir"
        elif not p.is_file():  # a FIFO a case made: reading it would block
            out[rel] = "special"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def refused(args: list[str], watch: Path, *, seconds: int = 20, words: str = "",
            codes: tuple[int, ...] = (1, 2)) -> subprocess.CompletedProcess[str]:
    """Run `migrate ARGS` on a hostile input and assert the promises. `watch` is the folder holding
    the inputs and the target (a pre-existing target included): after the run it must be exactly as
    before. `words`, when given, must be in the error line (what names the file, tensor or line)."""
    before = snapshot(watch)
    with alarm(seconds, f"migrate {' '.join(args)} ran past {seconds} s"):
        done = migrate_in_process(*args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode in codes, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr[-3000:]
    assert words in lines[0], lines[0]
    after = snapshot(watch)
    assert after == before, sorted(set(after.items()) ^ set(before.items()))
    return done

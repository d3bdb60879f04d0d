"""The `migrate` command for tests: in the test's own process (a subprocess starts a new interpreter
per call), or in a new process when the test needs one (exit on a signal, a fresh import state, the
`python -m migrator.cli` entry point); either way an exit code, stdout and stderr as a
CompletedProcess."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def migrate_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    from migrator.cli import main

    out, err, threshold = io.StringIO(), io.StringIO(), gc.get_threshold()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's usage errors
                code = int(e.code or 0)
    finally:
        gc.set_threshold(*threshold)  # main tunes the collector for a one-shot process
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def migrate_subprocess(*args: str, cwd: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None,
                       timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m migrator.cli ARGS` in a new process, this repository's package first on its path;
    `env` adds to (or overrides) this process's environment."""
    return subprocess.run([sys.executable, "-m", "migrator.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=timeout)


def convert_clean(src: str | os.PathLike[str], out: Path, *args: str) -> tuple[int, str]:
    """`migrate convert SRC OUT ARGS` in process, never a traceback: (exit code, stderr)."""
    p = migrate_in_process("convert", str(src), str(out), *args)
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    return p.returncode, p.stderr


def convert_refused(src: str | os.PathLike[str], tmp_path: Path, *words: str) -> str:
    """`convert SRC TMP/out.safetensors` refused as a data error in one line holding every one of `words`,
    with nothing written (no output, no scratch file left in TMP); the line."""
    out = tmp_path / "out.safetensors"
    code, stderr = convert_clean(src, out)
    assert code == 1, stderr
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    return lines[0]

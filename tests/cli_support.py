"""The `migrate` command run in the test's own process (a subprocess starts a new interpreter per
call): exit code, stdout and stderr as a CompletedProcess, like subprocess.run would give."""

from __future__ import annotations

import contextlib
import io
import subprocess


def migrate_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    from migrator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = int(e.code or 0)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())

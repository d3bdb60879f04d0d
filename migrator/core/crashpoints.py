"""Named points of the write path at which a test can freeze a run, to kill it in a known state.

`MIGRATOR_STOP_AT` lists points, comma-separated; on reaching one the process stops itself with
SIGSTOP, and the test, blocked in `waitpid(..., WUNTRACED)`, looks at the files, then kills the run
or lets it go on with SIGCONT. The points, in the order a single-file write passes them:

- `scratch-created`: the scratch file exists and is empty;
- `tensor:N`: the N-th tensor (1-based, counted over the process) was handed to the output;
- `written`: every byte is in the scratch file, not yet synced or published;
- `synced`: the scratch file is synced, the target not yet replaced;
- `published`: the target is the new file; the folder is not yet synced;
- `done`: the folder is synced.

`MIGRATOR_KILL_AT` lists points (same names) at which the process sends itself SIGKILL instead, as
the out-of-memory killer would: for runs whose process the test does not wait on (a `--jobs` worker).

The variables are read once, at import; unset (as everywhere outside the crash tests) a point costs a
lookup in an empty set. This gives the tests exact kill moments instead of timed guesses.
"""

from __future__ import annotations

import os
import signal

_STOPS = frozenset(p.strip() for p in os.environ.get("MIGRATOR_STOP_AT", "").split(",") if p.strip())
_KILLS = frozenset(p.strip() for p in os.environ.get("MIGRATOR_KILL_AT", "").split(",") if p.strip())
_POINTS = _STOPS | _KILLS
_tensors = 0


def reached(point: str) -> None:
    """Stop (or kill) this process if `point` is one a test asked for."""
    if point in _POINTS:
        os.kill(os.getpid(), signal.SIGKILL if point in _KILLS else signal.SIGSTOP)


def tensor_written() -> None:
    """Count one more tensor handed to the output, and stop at `tensor:N` when asked."""
    global _tensors
    if _POINTS:
        _tensors += 1
        reached(f"tensor:{_tensors}")

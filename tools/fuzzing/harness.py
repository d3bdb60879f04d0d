"""Running one case: the reader opened and everything touched and re-encoded (`exercise`), under a time
limit and an allocation budget (`run_case`); what counts as a failure."""

from __future__ import annotations

import gc
import json
import resource
import struct
import traceback
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import migrator
from migrator.core import dtypes
from migrator.core.errors import MigratorError

from .common import (
    ALLOC_SLACK,
    FORMAT_OF,
    MATERIALISE_LIMIT,
    AllocationExceeded,
    CaseTimeout,
    WrongResult,
    time_limit,
)
from .megatron import case_folder
from .recipe import _exercise_recipe
from .torch_dist import case_folder as torch_dist_folder


@dataclass
class CaseResult:
    outcome: str  # "ok" or the exception's class name
    error: BaseException | None
    peak: int  # tracemalloc peak above the case's start, bytes (0 when not measured)
    budget: int


def alloc_budget(size: int, factor: int, largest_tensor: int) -> int:
    return factor * size + ALLOC_SLACK + 3 * largest_tensor


def exercise(reader: str, data: bytes, *, path: Path | None = None, auto: bool = False,
             largest: list[int] | None = None) -> None:
    """Open `data` with the reader and touch everything; raises whatever the code under test raises.

    `path`: write the input there and open the file (FileSource, mmaps) instead of the buffer.
    `largest` (out): receives the largest tensor byte count touched (for the allocation budget).
    """
    if reader == "recipe":
        _exercise_recipe(data, path)
        return
    if reader in ("megatron-legacy", "torch-dist"):  # a folder of files, one of them `data`
        folder_of = case_folder if reader == "megatron-legacy" else torch_dist_folder
        with folder_of(data, path) as folder, migrator.open_file(folder) as r:
            _check_reader(r, len(data), largest)
            _round_trip(r)
        return
    fmt = "auto" if auto else FORMAT_OF[reader]
    src: Any = data
    if path is not None:
        path.write_bytes(data)
        src = path
    with migrator.open_file(src, format=fmt) as r:
        _check_reader(r, len(data), largest)
        _round_trip(r)


def _check_reader(r: Any, size: int, largest: list[int] | None) -> None:
    from migrator.analysis.inspect import summarize
    from migrator.core.limits import DEFAULT_LIMITS

    json.dumps(summarize(r), default=str)  # what `migrate inspect --json` prints
    assert isinstance(r.metadata, dict) and isinstance(r.scalars, dict)
    names = r.names()
    if len(set(names)) != len(names):
        raise WrongResult(f"duplicate tensor names {names}")
    for t in r.tensors:
        want = t.dtype.nbytes(t.shape)
        if want is not None and want != t.nbytes:
            raise WrongResult(f"{t.name}: declares {t.nbytes} bytes, shape/dtype need {want}")
        if t.nbytes > max(size, DEFAULT_LIMITS.max_expanded_bytes):
            raise WrongResult(f"{t.name}: declares {t.nbytes} bytes from a {size}-byte input")
        if t.nbytes > MATERIALISE_LIMIT:
            continue
        if largest is not None:
            largest[0] = max(largest[0], t.nbytes)
        buf = t.data()
        if len(buf) != t.nbytes:
            raise WrongResult(f"{t.name}: {len(buf)} bytes, declared {t.nbytes}")
        if t.dtype.numpy_name is not None:
            arr = t.numpy()
            if arr.shape != t.shape:
                raise WrongResult(f"{t.name}: numpy shape {arr.shape} != {t.shape}")
            del arr
        del buf
        _transforms(t)


def _transforms(t: Any) -> None:
    """What a recipe does to a tensor: a float cast (dtype: {cast: F16}) and a Linear transpose."""
    from migrator.core import casts

    made = []
    if t.dtype.name in casts.CASTABLE:
        made += [casts.cast(t, to) for to in (dtypes.F16, dtypes.BF16, dtypes.F64)]
    if len(t.shape) == 2 and t.dtype.itemsize is not None:
        made.append(casts.transpose2d(t))
    for d in made:
        whole = bytes(d.data())
        if len(whole) != d.nbytes:
            raise WrongResult(f"{t.name}: {d.dtype.display}{list(d.shape)} has {len(whole)} bytes, not {d.nbytes}")
        if d.chunks is not None and b"".join(bytes(c) for c in d.chunks()) != whole:
            raise WrongResult(f"{t.name}: streamed chunks differ from the whole for {d.dtype.display}")


def _round_trip(r: Any) -> None:
    """A file that opened must re-encode and read back equal (or be refused with a typed error).

    Written again in its own format (metadata and scalars kept where the format holds them) and,
    for SafeTensors and PyTorch sources, also as burnpack, which exercises the writers on whatever
    names and values a hostile file can smuggle in.
    """
    fmt = r.format
    targets = [fmt] if fmt == "burnpack" else [fmt, "burnpack"]
    for out in targets:
        same = out == fmt
        meta = r.metadata if same and out != "pytorch" else None
        scalars = r.scalars if out == "burnpack" else None
        try:
            blob = migrator.to_bytes(r.tensors, out, metadata=meta, scalars=scalars)
        except MigratorError:
            continue  # e.g. a dtype or name the writer refuses: fine, it is typed
        with migrator.open_file(blob, format=out) as back:
            a = {t.name: t for t in r.tensors}
            b = {t.name: t for t in back.tensors}
            if set(a) != set(b):
                raise WrongResult(f"re-encoded ({out}) names differ: {sorted(set(a) ^ set(b))[:5]}")
            for name, t in a.items():
                u = b[name]
                if (t.dtype.name, t.shape) != (u.dtype.name, u.shape) or bytes(t.data()) != bytes(u.data()):
                    raise WrongResult(f"{name}: re-encoded ({out}) tensor differs")
            got, want = back.metadata, meta
            if out == "gguf" and meta is not None:  # the writer computes these two from the tensors it writes
                got = {k: v for k, v in got.items() if k not in _GGUF_COMPUTED}
                want = {k: v for k, v in meta.items() if k not in _GGUF_COMPUTED}
            if want is not None and got != want:
                raise WrongResult(f"re-encoded ({out}) metadata differs")
            if scalars is not None and _scalar_keys(back.scalars) != _scalar_keys(scalars):
                raise WrongResult(f"re-encoded ({out}) scalars differ")


_GGUF_COMPUTED = ("general.file_type", "general.quantization_version")


def _scalar_keys(scalars: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Scalars compared bit for bit (a NaN equals itself)."""
    return {k: (s.kind, struct.pack("<d", s.value) if isinstance(s.value, float) else s.value)
            for k, s in scalars.items()}


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM (peak RSS) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def run_case(reader: str, data: bytes, *, timeout: float = 5.0, alloc_factor: int = 16, measure: str = "tracemalloc",
             path: Path | None = None, auto: bool = False,
             exercise: Callable[..., None] = exercise) -> CaseResult:
    """One case under a time limit and an allocation check; reports what happened, never raises.

    measure: "tracemalloc" (peak of Python and numpy allocations during the case; precise, ~2x
    slower), "rss" (peak resident set size during the case, reset through /proc/self/clear_refs;
    cheap, counts every page touched) or "none". `exercise`: what the case runs (tools/fuzz.py passes its
    own name's, which the tests replace to check the guards).
    """
    largest = [0]
    err: BaseException | None = None
    started = False
    base = 0
    if measure == "tracemalloc":
        if not tracemalloc.is_tracing():
            tracemalloc.start()
            started = True
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
    elif measure == "rss":
        # Garbage of earlier cases freed during this one would lower RSS and hide an allocation
        # (the peak only counts what rises above the starting RSS): collect it first.
        gc.collect()
        if not _reset_peak_rss():
            measure = "none"
        else:
            base = _vm("VmRSS")
    try:
        with time_limit(timeout):
            exercise(reader, data, path=path, auto=auto, largest=largest)
    except (Exception, CaseTimeout) as e:  # KeyboardInterrupt/SystemExit still stop the run
        err = e
    peak = 0
    if measure == "tracemalloc":
        peak = tracemalloc.get_traced_memory()[1] - base
        if started:
            tracemalloc.stop()
    elif measure == "rss":
        peak = _vm("VmHWM") - base
    budget = alloc_budget(len(data), alloc_factor, largest[0])
    if peak > budget and (err is None or isinstance(err, MigratorError)):
        err = AllocationExceeded(f"peak {peak} bytes > budget {budget} for a {len(data)}-byte input")
    if err is None:
        return CaseResult("ok", None, peak, budget)
    return CaseResult(type(err).__name__, err, peak, budget)


def is_failure(res: CaseResult) -> bool:
    """Anything but success or a typed migrator error."""
    return res.error is not None and not isinstance(res.error, MigratorError)


def _signature(err: BaseException) -> str:
    tb = traceback.extract_tb(err.__traceback__)
    where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if "migrator" in f.filename),
                 f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?")
    return f"{type(err).__name__}@{where}"


def _set_memory_backstop(extra: int) -> None:
    """RLIMIT_AS = what the process maps now + `extra`: a runaway allocation fails as MemoryError."""
    vm = _vm("VmSize")
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = vm + extra
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))

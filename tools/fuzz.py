"""Long-running mutation fuzzer for migrator's readers and its recipe loader.

    .venv/bin/python tools/fuzz.py --reader burnpack --cases 100000
    .venv/bin/python tools/fuzz.py --reader safetensors --differential --cases 100000
    .venv/bin/python tools/fuzz.py --reader pytorch-zip --differential --cases 100000
    .venv/bin/python tools/fuzz.py --reader gguf --differential --cases 100000

Readers: burnpack, safetensors, pytorch-zip, pytorch-legacy, pytorch-tar, gguf, megatron-legacy (one
rank file of a legacy Megatron-LM checkpoint folder, opened with the others), torch-dist (one file of a
megatron-core torch_dist folder: `.metadata`, `common.pt`, a rank's `.distcp` or `metadata.json`, named
by the input's first byte, opened with the others), recipe. Seeds are made on the spot (migrator's
own writers; torch for the legacy, TAR, torch-written zip and torch_dist seeds) and mutated by byte
flips, truncations, insertions, deletions, splices and overwrites of length fields with huge or
negative values; the zip and TAR mutators can also repair CRCs and header checksums so mutations
reach the pickles behind them.

Every case must end in a `MigratorError` subclass or a correct result (every tensor's bytes have
the declared length, numpy views have the declared shape, and a re-encoded copy reads back equal).
Anything else is a crash, saved under `tools/fuzz-crashes/` (gitignored):

* another exception type (ValueError, IndexError, RecursionError, MemoryError, ...);
* a hang: SIGALRM fails a case after `--timeout` seconds; a hang inside C code, which a Python
  signal handler cannot interrupt, is ended by faulthandler's watchdog, and the input it was
  working on is kept in `.inflight-*` and reported by the next run;
* an allocation larger than the input justifies: tracemalloc's peak per case must stay below
  `--alloc-factor` x input size + 64 MiB (+ 3x the largest tensor touched, which a reader only
  declares within its limits). RLIMIT_AS is set as a backstop, so a runaway allocation becomes a
  MemoryError crash instead of taking the machine down.

`--differential` (safetensors, burnpack) reads every mutated input with the reader's header fast
path and with the reference parser alone, and counts any difference in tensors (bytes included),
metadata, scalars, extra() or error (type, message, tensor) as a failure. `--reader gguf
--differential` reads every mutated input migrator accepts with gguf-py's reader as well: both must
agree on tensor names, ggml types, shapes, stored bytes and key/values; every input migrator refuses
is given to gguf-py too, and counted as "both refuse" or "only gguf-py reads it" (not failures:
migrator refuses overlapping or misaligned data, truncated tensor data and claims past its limits,
which gguf-py reads or maps lazily). gguf-py gets --oracle-timeout seconds (default 1) on an input
migrator refuses: it loops over whatever count a header claims, and a refusal it would reach later
decides nothing about migrator.

The fuzzer is the package `tools/fuzzing/`, one module per reader family (see its docstring); this
file is its command line and the names the tests use. It is also imported by tests/formats/test_fuzz.py,
which runs the same seeds, mutations and checks under Hypothesis for a bounded number of cases.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hashlib
import json
import os
import random
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:  # `from tools import fuzz` finds the package too
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzzing import harness
from fuzzing.common import (
    CRASH_DIR,
    READERS,
    AllocationExceeded,
    CaseTimeout,
    WrongResult,
    time_limit,
)
from fuzzing.gguf import _gguf_py_facts, _migrator_gguf_facts, differential_gguf, gguf_seeds
from fuzzing.harness import (
    CaseResult,
    _check_reader,
    _set_memory_backstop,
    _signature,
    alloc_budget,
    exercise,
    is_failure,
)
from fuzzing.headers import (
    DIFFERENTIAL_READERS,
    JSON_NUMBERS,
    _header_reader_classes,
    burnpack_seeds,
    differential_outcome,
    fast_path_taken,
    run_differential,
    safetensors_seeds,
)
from fuzzing.mutations import INTERESTING, apply_op, apply_ops, build_seeds, random_ops
from fuzzing.pytorch import (
    differential_pickle,
    fix_tar_checksums,
    mutate_pickle,
    pickle_seeds,
    pytorch_legacy_seeds,
    pytorch_tar_seeds,
    pytorch_zip_seeds,
)
from fuzzing.recipe import RECIPE_FULL, recipe_seeds

__all__ = ["CRASH_DIR", "DIFFERENTIAL_READERS", "INTERESTING", "JSON_NUMBERS", "READERS", "RECIPE_FULL",
           "AllocationExceeded", "CaseResult", "CaseTimeout", "WrongResult", "_check_reader", "_gguf_py_facts",
           "_header_reader_classes", "_migrator_gguf_facts", "alloc_budget", "apply_op", "apply_ops", "build_seeds",
           "burnpack_seeds", "differential_gguf", "differential_outcome", "differential_pickle", "exercise",
           "fast_path_taken", "fix_tar_checksums", "gguf_seeds", "is_failure", "main", "mutate_pickle",
           "pickle_seeds", "pytorch_legacy_seeds", "pytorch_tar_seeds", "pytorch_zip_seeds", "random_ops",
           "recipe_seeds", "run_case", "run_differential", "safetensors_seeds", "time_limit"]


def run_case(reader: str, data: bytes, **options: Any) -> CaseResult:
    """`fuzzing.harness.run_case` running this module's `exercise`, looked up at each call: a test replaces
    `fuzz.exercise` (a hang, an allocation bomb) to check that the guards catch it."""
    return harness.run_case(reader, data, exercise=exercise, **options)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reader", choices=READERS, required=True)
    p.add_argument("--cases", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per case")
    p.add_argument("--alloc-factor", type=int, default=16, help="allowed peak = factor x input + 64 MiB")
    p.add_argument("--measure", choices=("rss", "tracemalloc", "none"), default="rss",
                   help="allocation check per case: peak RSS (default, cheap) or tracemalloc (precise, slower)")
    p.add_argument("--memory-backstop", type=int, default=4 << 30, help="RLIMIT_AS headroom in bytes")
    p.add_argument("--max-seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--oracle-timeout", type=float, default=1.0,
                   help="--reader gguf --differential: seconds gguf-py gets on an input migrator refuses")
    p.add_argument("--report", type=Path, default=None, help="write the summary as JSON here too")
    p.add_argument("--crash-dir", type=Path, default=CRASH_DIR)
    p.add_argument("--differential", action="store_true",
                   help="compare fast and reference paths on every mutated input (safetensors, burnpack: the "
                        "header fast path against the reference parser; pytorch-*: the pickle record scanner "
                        "against the opcode loop; gguf: migrator's reader against gguf-py's)")
    args = p.parse_args(argv)

    seed = args.seed if args.seed is not None else int(time.time())
    if args.differential and args.reader.startswith("pytorch"):
        summary = differential_pickle(args.cases, seed, args.timeout)
        print(json.dumps(summary))
        return 1 if summary["differences"] else 0
    rng = random.Random(seed)
    crash_dir: Path = args.crash_dir
    crash_dir.mkdir(parents=True, exist_ok=True)
    if args.differential and args.reader == "gguf":
        # gguf-py is not bounded: it allocates what a hostile header claims (the backstop turns that into a
        # MemoryError, one more way for it to refuse, instead of the machine's OOM killer)
        _set_memory_backstop(args.memory_backstop)
        summary = {"seed": seed, **differential_gguf(args.cases, rng, args.timeout, crash_dir, args.max_seconds,
                                                     args.oracle_timeout)}
        print(json.dumps(summary, indent=2))
        if args.report:
            args.report.write_text(json.dumps(summary, indent=2) + "\n")
        return 1 if summary["differences"] or summary["timeouts"] else 0
    if args.differential:
        if args.reader not in DIFFERENTIAL_READERS:
            p.error(f"--differential compares header fast paths: --reader {' or '.join(DIFFERENTIAL_READERS)}")
        _set_memory_backstop(args.memory_backstop)
        summary = {"seed": seed, **run_differential(args.reader, args.cases, rng, args.timeout, crash_dir,
                                                    args.max_seconds)}
        print(json.dumps(summary, indent=2))
        print(f"differential {args.reader}: {summary['cases']} cases, {summary['differences']} differences, "
              f"{summary['timeouts']} timeouts, fast path taken in {summary['outcomes'].get('fast path', 0)}")
        if args.report:
            args.report.write_text(json.dumps(summary, indent=2) + "\n")
        return 1 if summary["differences"] or summary["timeouts"] else 0
    inflight = crash_dir / f".inflight-{args.reader}-{os.getpid()}.bin"
    for old in crash_dir.glob(f".inflight-{args.reader}-*.bin"):  # a previous run died inside a case
        target = crash_dir / f"{args.reader}-died-{hashlib.sha1(old.read_bytes()).hexdigest()[:12]}.bin"
        old.replace(target)
        print(f"previous run died on an input (hang in C code or hard crash): saved {target}", file=sys.stderr)

    seeds = build_seeds(args.reader)
    for s in seeds:
        res = run_case(args.reader, s, timeout=30, measure="none")
        if res.error is not None:
            raise SystemExit(f"seed does not pass: {res.outcome}: {res.error}")
    _set_memory_backstop(args.memory_backstop)
    if args.measure == "tracemalloc":
        tracemalloc.start()
    scratch = Path(tempfile.mkdtemp(prefix="migrator-fuzz-"))
    pool = list(seeds)  # grows with mutated inputs that still open: deeper corpus
    outcomes: Counter[str] = Counter()
    signatures: dict[str, str] = {}
    started = time.monotonic()
    n = 0
    try:
        for n in range(1, args.cases + 1):
            base = rng.choice(pool)
            data = apply_ops(base, random_ops(rng, base, args.reader), args.reader, pool)
            path = scratch / ("in.yaml" if args.reader == "recipe" else "in.bin") if n % 16 == 0 else None
            inflight.write_bytes(data)
            faulthandler.dump_traceback_later(args.timeout * 6 + 30, exit=True)
            res = run_case(args.reader, data, timeout=args.timeout, alloc_factor=args.alloc_factor,
                           measure=args.measure, path=path, auto=n % 8 == 0)
            faulthandler.cancel_dump_traceback_later()
            if res.error is None and len(pool) < 512 and data not in pool and rng.random() < 0.2:
                pool.append(data)
            key = res.outcome if not is_failure(res) else f"FAIL {res.outcome}"
            outcomes[key] += 1
            if is_failure(res):
                assert res.error is not None
                sig = _signature(res.error)
                if sig not in signatures:
                    name = f"{args.reader}-{res.outcome}-{hashlib.sha1(data).hexdigest()[:12]}.bin"
                    (crash_dir / name).write_bytes(data)
                    signatures[sig] = name
                    print(f"[{n}] NEW FAILURE {sig}: {str(res.error)[:300]} -> {crash_dir / name}",
                          file=sys.stderr, flush=True)
            if n % 10_000 == 0:
                rate = n / (time.monotonic() - started)
                print(f"[{n}] {rate:.0f} cases/s {dict(outcomes.most_common(8))}", file=sys.stderr, flush=True)
            if args.max_seconds and time.monotonic() - started > args.max_seconds:
                break
    finally:
        with contextlib.suppress(OSError):
            inflight.unlink()
        for f in scratch.iterdir():
            f.unlink()
        scratch.rmdir()
    elapsed = time.monotonic() - started
    summary = {"reader": args.reader, "seed": seed, "cases": n, "seconds": round(elapsed, 1),
               "outcomes": dict(outcomes.most_common()), "failures": sorted(signatures.items()),
               "pool": len(pool)}
    print(json.dumps(summary, indent=2))
    if args.report:
        args.report.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if signatures else 0


if __name__ == "__main__":
    sys.exit(main())

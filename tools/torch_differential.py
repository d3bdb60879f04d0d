"""migrator against torch.load(weights_only=True) on mutated PyTorch files (issue 19 item 2).

A file that torch loads must give torch's tensors in migrator or a typed migrator error, never other
values. Each case is a seed of tools/fuzz.py mutated by its operators; torch runs in this process
with weights_only=True (its restricted unpickler), under an address-space cap.

    python tools/torch_differential.py --reader pytorch-zip --cases 20000 --seed 1

prints a JSON summary (outcomes: same / migrator refused / torch refused) and exits 1 on the first
case where both read the file and disagree, saving it under --crash-dir.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import random
import resource
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz

import migrator
from migrator.core.dtypes import BY_TORCH
from migrator.core.errors import MigratorError


@contextlib.contextmanager
def address_space_cap(extra: int = 2 << 30) -> Iterator[None]:
    """torch.load of a hostile file may try a huge allocation: let it fail instead of swapping."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * resource.getpagesize()
    cap = vm + extra if hard == resource.RLIM_INFINITY else min(hard, vm + extra)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def torch_tensors(obj: Any, prefix: str = "") -> dict[str, Any]:
    """The tensors of a loaded object under the names migrator gives them (dicts by str/int key, lists
    and tuples by index, joined with dots)."""
    out: dict[str, Any] = {}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        if type(k) not in (str, int):
            continue
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, torch.Tensor):
            out[name] = v
        else:
            out.update(torch_tensors(v, name))
    return out


def torch_bytes(t: Any) -> bytes:
    if t.numel() == 0:
        return b""
    # a fresh tensor with C strides: contiguous() keeps a stride of 0 on a size-1 dimension, and
    # view(uint8) then refuses it
    dense = torch.empty(tuple(t.shape), dtype=t.dtype).copy_(t.detach())
    return bytes(dense.reshape(-1).view(torch.uint8).numpy().tobytes())


def torch_load(raw: bytes) -> Any:
    """torch's reading, or None when torch refuses the file."""
    try:
        with address_space_cap(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(raw), weights_only=True)
    except Exception:  # any refusal: the file is not one torch loads
        return None


def migrator_load(raw: bytes) -> dict[str, tuple[Any, tuple[int, ...], bytes]] | MigratorError:
    """migrator's tensors (dtype, shape, bytes), or its typed error; any other exception propagates."""
    try:
        with migrator.open_file(raw, format="pytorch") as r:
            return {t.name: (t.dtype, t.shape, bytes(t.data())) for t in r.tensors}
    except MigratorError as e:
        return e


def compare(raw: bytes) -> str:
    """'same', 'migrator refused' or 'torch refused'; an AssertionError when both read and differ."""
    mine = migrator_load(raw)
    if isinstance(mine, MigratorError):
        return "migrator refused"
    loaded = torch_load(raw)
    if loaded is None:
        return "torch refused"
    theirs = torch_tensors(loaded)
    assert sorted(mine) == sorted(theirs), (sorted(mine), sorted(theirs))
    for name, (dtype, shape, data) in mine.items():
        t = theirs[name]
        assert BY_TORCH[str(t.dtype).removeprefix("torch.")] == dtype, (name, dtype, t.dtype)
        assert shape == tuple(t.shape), (name, shape, tuple(t.shape))
        assert data == torch_bytes(t), name
    return "same"


def run(reader: str, cases: int, seed: int) -> tuple[dict[str, int], list[tuple[int, bytes, str]]]:
    """Outcome counts and the disagreements (case number, file, what differed) of a seeded run."""
    seeds = fuzz.build_seeds(reader)
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    differ: list[tuple[int, bytes, str]] = []
    for case in range(cases):
        base = seeds[case % len(seeds)]
        data = fuzz.apply_ops(base, fuzz.random_ops(rng, base, reader), reader, seeds)
        try:
            outcome = compare(data)
        except AssertionError as e:
            outcome = "DIFFERENT"
            differ.append((case, data, str(e)[:300]))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes, differ


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reader", choices=("pytorch-zip", "pytorch-legacy"), required=True)
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--crash-dir", type=Path, default=fuzz.CRASH_DIR)
    args = p.parse_args(argv)
    outcomes, differ = run(args.reader, args.cases, args.seed)
    for case, data, what in differ:
        args.crash_dir.mkdir(parents=True, exist_ok=True)
        path = args.crash_dir / f"torch-differs-{hashlib.sha1(data).hexdigest()[:12]}.bin"
        path.write_bytes(data)
        print(f"case {case}: {what} -> {path}", file=sys.stderr)
    print(json.dumps({"reader": args.reader, "seed": args.seed, "cases": args.cases, "outcomes": outcomes}))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

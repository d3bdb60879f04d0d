"""The tensor-record scanner of `safepickle` (`safepickle.records`) must change nothing but the speed.

Every check here runs the same input twice, with the scanner on and off (`Unpickler(fast=...)`; the
opcode loop is the reference), and compares everything observable: the pickled graph, the values
pushed (the `max_objects` count), the reader's tensors, bytes and extras, and the exact error of a
broken or hostile input. torch.load is the oracle for the values.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import pickle
import random
import re
import struct
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import migrator
from migrator.core.errors import FormatError, MigratorError
from migrator.core.tensor import from_numpy
from migrator.formats import safepickle as sp

torch = pytest.importorskip("torch")


# ----------------------------------------------------------------------------------------------
# inputs


def state_dict() -> dict[str, Any]:
    """Every record shape torch writes: dtypes, 0-5 dimensions, big sizes, views, ties, nesting."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    sd: dict[str, Any] = {
        "f32": torch.randn(3, 4, generator=g),
        "f16": torch.randn(7, generator=g).half(),
        "bf16": torch.randn(2, 3, generator=g).bfloat16(),
        "f64": torch.randn(2, generator=g).double(),
        "i64": torch.arange(300),  # sizes > 255: BININT2
        "big": torch.zeros(70_000, dtype=torch.uint8),  # > 65535: BININT
        "bool": torch.tensor([True, False, True]),
        "i8": torch.tensor([-1, 2], dtype=torch.int8),
        "scalar": torch.tensor(3.5),  # 0-d: EMPTY_TUPLE size and stride
        "empty": torch.zeros(0, 4),
        "d4": torch.randn(2, 3, 1, 2, generator=g),  # MARK ... TUPLE dimensions
        "d5": torch.randn(1, 2, 1, 2, 1, generator=g),
        "t": base.t(),  # strided
        "slice": base[1:4, ::2],  # offset and step
        "expand": torch.randn(3, 1, generator=g).expand(3, 4),  # stride 0
        "view_a": base[0],
        "view_b": base[2:],  # two views of one storage
        "grad": torch.ones(2, requires_grad=True),  # NEWTRUE
        "nested": {"x": torch.ones(2), "list": [torch.zeros(1), torch.ones(1, 1)], "5": torch.ones(3)},
        "meta": "text",
        "n": 3,
        "f": 1.5,
    }
    sd["tied"] = sd["f32"]  # the same tensor object: a memo read of the whole record
    for i in range(300):  # > 256 memo entries: LONG_BINPUT / LONG_BINGET
        sd[f"many.{i}"] = torch.full((i % 3 + 1,), float(i))
    return sd


def torch_file(**save_kwargs: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(state_dict(), buf, **save_kwargs)
    return buf.getvalue()


def migrator_file() -> bytes:
    """A .pt written by migrator's own writer (as the benchmarks are): few memo writes."""
    rng = np.random.default_rng(0)
    tensors = [from_numpy(f"h.{i}.w", rng.standard_normal((i % 4 + 1, 3)).astype(np.float32)) for i in range(200)]
    tensors.append(from_numpy("scalar", np.array(2.0, np.float32)))
    return migrator.files.io.to_bytes(tensors, "pytorch")


VARIANTS: dict[str, Callable[[], bytes]] = {
    "zip-p2": torch_file,
    "zip-p3": lambda: torch_file(pickle_protocol=3),
    "zip-p4": lambda: torch_file(pickle_protocol=4),
    "zip-p5": lambda: torch_file(pickle_protocol=5),
    "legacy": lambda: torch_file(_use_new_zipfile_serialization=False),
    "migrator": migrator_file,
}


def data_pkl(raw: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))


# ----------------------------------------------------------------------------------------------
# helpers


class Counting:
    """Counts the records the fast path committed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken = 0
        inner = sp.records._commit

        def wrapped(*args: Any) -> None:
            self.taken += 1
            inner(*args)

        monkeypatch.setattr(sp.records, "_commit", wrapped)


def norm(v: Any, seen: dict[int, int] | None = None) -> Any:
    """A comparable form of an unpickled graph (shared references become back-references)."""
    seen = {} if seen is None else seen
    if isinstance(v, (sp.TensorRef, sp.StorageRef, sp.ODict, dict, list, tuple)):
        if id(v) in seen:
            return ("ref", seen[id(v)])
        seen[id(v)] = len(seen)
    if isinstance(v, sp.TensorRef):
        return ("T", norm(v.storage, seen), v.offset, v.size, v.stride, v.dtype, v.requires_grad)
    if isinstance(v, sp.StorageRef):
        return ("S", v.key, v.storage_type, v.dtype, v.numel, v.location, v.view)
    if isinstance(v, sp.ODict):
        return ("OD", [(k, norm(x, seen)) for k, x in v.items()], norm(dict(v.attrs), seen))
    if isinstance(v, dict):
        return ("D", [(norm(k, seen), norm(x, seen)) for k, x in v.items()])
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [norm(x, seen) for x in v])
    if isinstance(v, (sp.Opaque, sp.UnsupportedTensor, sp.NumpyArray, sp.NumpyDtype)):
        return (type(v).__name__, repr(v))
    return v


def storage_pid(pid: Any) -> Any:
    """Like the zip reader's persistent_load: refuses what is not a storage id (raising its error)."""
    if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage":
        raise FormatError(f"bad persistent id {str(pid)[:60]}")
    stype = pid[1]
    return sp.StorageRef(str(pid[2]), getattr(stype, "name", "?"), getattr(stype, "dtype", None),
                         pid[4] if type(pid[4]) is int else None, str(pid[3]))


def run_pickle(data: bytes, fast: bool, limits: sp.Limits = sp.DEFAULT_LIMITS,
               persistent: Callable[[Any], Any] | None = storage_pid) -> Any:
    u = sp.Unpickler(data, persistent_load=persistent, limits=limits, fast=fast)
    try:
        result = u.load()
    except MigratorError as e:
        return ("error", type(e).__name__, str(e))
    return ("ok", norm(result), u.objects, u.pos, u.protocol, sorted(u.opaque))


def reader_facts(path: Path, limits: sp.Limits = sp.DEFAULT_LIMITS) -> Any:
    try:
        r = migrator.open_file(path, limits=limits)
    except MigratorError as e:
        return ("error", type(e).__name__, str(e), getattr(e, "tensor", None))
    with r:
        tensors = [(t.name, t.dtype.name, t.shape, t.nbytes, t.param_id, t.origin,
                    None if t.span is None else (t.span.offset, t.span.length), bytes(t.data()))
                   for t in r.tensors]
        return ("ok", tensors, r.metadata, {k: repr(v) for k, v in r.scalars.items()}, r.extra(),
                r.shared_storages())


def both_ways(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], Any]) -> tuple[Any, Any]:
    """`fn()` with the readers' unpicklers made with the scanner on, then off."""
    results = []
    for on in (True, False):
        with monkeypatch.context() as m:
            m.setattr(sp, "Unpickler", functools.partial(sp.vm.Unpickler, fast=on))
            results.append(fn())
    return results[0], results[1]


def flat(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    items = d.items() if isinstance(d, dict) else enumerate(d)
    for k, v in items:
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, (dict, list)):
            yield from flat(v, name)
        else:
            yield name, v


# ----------------------------------------------------------------------------------------------
# torch's own files


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fast_and_general_paths_read_torch_files_identically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             variant: str) -> None:
    path = tmp_path / "m.pt"
    path.write_bytes(VARIANTS[variant]())
    counter = Counting(monkeypatch)
    fast, general = both_ways(monkeypatch, lambda: reader_facts(path))
    assert fast[0] == "ok", fast
    assert fast == general
    if variant not in ("zip-p4", "zip-p5"):  # protocol 4+ memoizes with MEMOIZE: the general loop reads those
        assert counter.taken >= 100, "the fast path was not used"


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "migrator"])
def test_values_equal_torch_load(tmp_path: Path, variant: str) -> None:
    path = tmp_path / "m.pt"
    path.write_bytes(VARIANTS[variant]())
    expected = dict(flat(torch.load(path, weights_only=False)))  # our own file: trusted
    with migrator.open_file(path) as r:
        assert len(r.tensors) == sum(isinstance(v, torch.Tensor) for v in expected.values())
        for t in r.tensors:
            want = expected[t.name]
            assert t.shape == tuple(want.shape), t.name
            raw = want.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            assert bytes(t.data()) == raw, t.name
        assert r.metadata == {"meta": "text"}


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "legacy"])  # legacy: several pickles
def test_unpickled_graphs_and_counts_are_identical(variant: str) -> None:
    data = data_pkl(VARIANTS[variant]())
    fast, general = run_pickle(data, True), run_pickle(data, False)
    assert fast[0] == "ok", fast
    assert fast == general  # graph, values pushed, end position, protocol, opaque names


def test_memo_and_stack_are_released_at_stop() -> None:
    u = sp.Unpickler(data_pkl(torch_file()), persistent_load=storage_pid)
    u.load()
    assert u.memo == {} and u.stack == [] and u.metastack == []


# ----------------------------------------------------------------------------------------------
# broken and hostile inputs: the same error either way


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from fuzz import mutate_pickle as mutations  # noqa: E402  (the long-running fuzzer's pickle mutator)

TIGHT = [
    sp.DEFAULT_LIMITS,
    sp.Limits(max_objects=500),
    sp.Limits(max_memo=20),
    sp.Limits(max_marks=2),
    sp.Limits(max_marks=3),
    sp.Limits(max_stack=7),
    sp.Limits(max_stack=9),
    sp.Limits(max_dims=1),
]


@pytest.mark.parametrize("variant", ["zip-p2", "migrator"])
def test_mutated_pickles_fail_or_succeed_identically(variant: str) -> None:
    seed_data = data_pkl(VARIANTS[variant]())
    # a slice of a few records keeps each case quick
    head = seed_data[:1500] if variant == "zip-p2" else seed_data[:900]
    rng = random.Random(1234)
    for case in range(1500):
        data = mutations(head, rng) if case else head
        limits = TIGHT[case % len(TIGHT)]
        persistent = storage_pid if case % 5 else (lambda pid: pid)  # a container returning something odd
        fast = run_pickle(data, True, limits, persistent)
        general = run_pickle(data, False, limits, persistent)
        assert fast == general, f"case {case}: {data!r}"


def test_limits_hit_inside_a_record_raise_the_general_error() -> None:
    data = data_pkl(torch_file())
    for limits in TIGHT[1:]:
        fast, general = run_pickle(data, True, limits), run_pickle(data, False, limits)
        assert fast[0] == "error" and fast == general, limits


def load_hostile() -> Any:
    spec = importlib.util.spec_from_file_location("hostile_corpus", Path(__file__).with_name("test_hostile.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_hostile_corpus_fails_identically_on_both_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hostile = load_hostile()
    quick = sp.Limits(max_nodes=20_000)  # the memo bomb's walk, kept quick
    sentinel = tmp_path / "pwned"
    for attack in hostile.ATTACKS:
        for container, wrap in hostile.CONTAINERS.items():
            path = tmp_path / f"evil-{container}.pt"
            path.write_bytes(wrap(attack.build(sentinel)))
            fast, general = both_ways(monkeypatch, lambda p=path: reader_facts(p, quick))
            assert fast[0] == "error", (attack.name, container, fast)
            assert fast == general, (attack.name, container)
            assert not sentinel.exists()


def test_a_non_storage_persistent_id_result_fails_like_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    data = data_pkl(torch_file())
    fast = run_pickle(data, True, persistent=lambda pid: "not a storage")
    general = run_pickle(data, False, persistent=lambda pid: "not a storage")
    assert fast[0] == "error" and "storage argument must come from a storage persistent id" in fast[2]
    assert fast == general


def test_pickle_dumps_of_rebuild_records_match() -> None:
    """Records built by Python's pickler (not torch's): BINPUT everywhere, GLOBALs inside the record."""

    class Rebuild:
        def __reduce__(self) -> Any:
            return (torch._utils._rebuild_tensor_v2, (Storage(), 0, (2, 3), (3, 1), False, __import__(
                "collections").OrderedDict()))

    class Storage:
        pass

    class P(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, Storage):
                return ("storage", torch.FloatStorage, "0", "cpu", 6)
            return None

    for protocol in (2, 3):
        buf = io.BytesIO()
        P(buf, protocol=protocol).dump({"a": Rebuild(), "b": [Rebuild(), Rebuild()]})
        fast, general = run_pickle(buf.getvalue(), True), run_pickle(buf.getvalue(), False)
        assert fast[0] == "ok" and fast == general


# ----------------------------------------------------------------------------------------------
# mutated records from inside the pickle


@pytest.mark.parametrize("variant", ["zip-p2", "migrator"])
def test_mutated_records_past_256_memo_entries_read_the_same_both_ways(variant: str) -> None:
    """Records from the start and from the middle, where torch's memo indices need LONG_BINPUT."""
    data = data_pkl(VARIANTS[variant]())
    heads = [data[:1500], data[:200] + data[len(data) // 2 : len(data) // 2 + 1200]]
    rng = random.Random(99)
    for case in range(600):
        edited = mutations(heads[case % 2], rng)
        limits = TIGHT[case % len(TIGHT)]
        assert run_pickle(edited, True, limits) == run_pickle(edited, False, limits), f"case {case}: {edited!r}"


# ----------------------------------------------------------------------------------------------
# memo writes inside records


def test_a_memo_write_before_a_known_tail_is_seen_by_its_reads() -> None:
    """A name's memo write that overwrites what the record reads next (location, OrderedDict, callee)."""
    data = data_pkl(migrator_file())
    names = [i for i in range(len(data)) if data.startswith(b"X\x06\x00\x00\x00h.1", i)]
    assert len(names) > 5
    at = names[5] + 11  # after the sixth name: its shape's tail is known by then
    checked = 0
    for index in range(12):
        edited = data[:at] + bytes([0x71, index]) + data[at:]
        fast, general = run_pickle(edited, True), run_pickle(edited, False)
        assert fast == general, index
        checked += fast[0] == "ok"
    assert checked


def test_a_memo_write_inside_a_torch_record_is_seen_by_its_later_reads() -> None:
    """torch's records past 255 memo entries: a persistent id written over what the record reads next
    (in the last record: in an earlier one, the next record would read it too and fail either way)."""
    data = data_pkl(torch_file())
    at = [m.start() + 2 for m in re.finditer(rb"tr.{4}Q", data, re.DOTALL) if m.start() > len(data) // 2]
    assert at
    checked = 0
    for index in range(16):
        edited = data[: at[-1]] + struct.pack("<I", index) + data[at[-1] + 4 :]  # the last record
        fast, general = run_pickle(edited, True), run_pickle(edited, False)
        assert fast == general, index
        checked += fast[0] == "ok"
    assert checked


def test_a_pickle_cut_after_a_record_fails_at_the_same_byte() -> None:
    """The end-of-input error names where the input ended, however many opcodes the scanner read."""
    data = data_pkl(torch_file())
    cuts = [m.end() + (1 if m.group()[-1:] == b"q" else 4) for m in re.finditer(rb"R[qr]", data)]
    cuts = cuts[:10] + cuts[-10:]
    assert cuts
    for cut in cuts:
        fast, general = run_pickle(data[:cut], True), run_pickle(data[:cut], False)
        assert fast[0] == "error" and fast == general, cut

"""Hypothesis fuzzing of every reader and of the recipe loader (bounded: CI runs a fixed number).

Seeds are valid files made here (migrator's writers; torch for the legacy, TAR and torch-zip
seeds); Hypothesis draws mutations -- byte flips, truncations, insertions, deletions, duplicated
chunks, length/offset/count fields overwritten with huge or negative values, zip members rewritten
with correct CRCs, TAR checksums repaired, recipe lines and values replaced -- which are applied by
the same interpreter as the long-running fuzzer (`tools/fuzz.py`, >= 100k cases per reader).

Each case must end in a `MigratorError` or a correct result, within a SIGALRM time limit (a hang
fails the case) and a tracemalloc budget (peak <= 16 x input + 64 MiB + 3 x the largest tensor
touched). `test_harness_*` show that each guard can actually fail. Set MIGRATOR_FUZZ_EXAMPLES to
run more cases per reader.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import struct
import subprocess
import sys
import traceback
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrator.core import casts, dtypes
from migrator.core.errors import FormatError, MigratorError
from migrator.core.tensor import LazyTensor
from migrator.files.io import open_file
from migrator.recipe.loader import RecipeError, parse_recipe

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import fuzz  # noqa: E402

pytest.importorskip("torch")  # legacy, TAR and torch-zip seeds

EXAMPLES = int(os.environ.get("MIGRATOR_FUZZ_EXAMPLES", "400"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SEEDS = {r: fuzz.build_seeds(r) for r in fuzz.READERS}
# SIGALRM per case: catches a hang, and is far above any case's time on a busy machine (cases take ms).
CASE_TIMEOUT = 30.0
CASES: Counter[str] = Counter()
OUTCOMES: dict[str, Counter[str]] = {r: Counter() for r in fuzz.READERS}


# ----------------------------------------------------------------------------------------------
# strategies: plain tuples, interpreted by fuzz.apply_op


POS = st.integers(0, 1 << 20)
VALUE = st.one_of(st.sampled_from(fuzz.INTERESTING), st.integers(-(1 << 63), (1 << 64) - 1))
BYTE_OPS = st.one_of(
    st.tuples(st.just("flip"), POS, st.integers(0, 7)),
    st.tuples(st.just("set"), POS, st.integers(0, 255)),
    st.tuples(st.just("truncate"), POS),
    st.tuples(st.just("insert"), POS, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), POS, st.integers(1, 64)),
    st.tuples(st.just("dup"), POS, st.integers(1, 256), POS),
)
FIELD_OPS = st.one_of(
    st.tuples(st.just("int"), POS, st.sampled_from((1, 2, 4, 8)), VALUE, st.sampled_from("<>")),
    st.tuples(st.just("field"), st.integers(0, 1 << 16), VALUE),
)
EXTRA_OPS: dict[str, Any] = {
    "safetensors": st.tuples(st.just("json-num"), st.integers(0, 255), st.sampled_from(fuzz.JSON_NUMBERS)),
    "pytorch-zip": st.tuples(st.just("zip-pkl"), st.lists(st.one_of(BYTE_OPS, FIELD_OPS), min_size=1, max_size=3)),
    "megatron-legacy": st.tuples(st.just("zip-pkl"), st.lists(st.one_of(BYTE_OPS, FIELD_OPS), min_size=1,
                                                              max_size=3)),
    "torch-dist": st.tuples(st.just("zip-pkl"), st.lists(st.one_of(BYTE_OPS, FIELD_OPS), min_size=1, max_size=3)),
    "pytorch-tar": st.one_of(st.tuples(st.just("tar-size"), st.integers(0, 7), VALUE), st.just(("tar-fix",))),
    "recipe": st.tuples(st.just("yaml-line"), st.integers(0, 6), st.integers(0, 1 << 16), st.integers(0, 1 << 16)),
}


def ops_for(reader: str) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    parts = [BYTE_OPS, FIELD_OPS] + ([EXTRA_OPS[reader]] * 2 if reader in EXTRA_OPS else [])
    return st.lists(st.one_of(*parts), min_size=1, max_size=4)


def check(reader: str, data: bytes, **options: Any) -> None:
    res = fuzz.run_case(reader, data, timeout=CASE_TIMEOUT, measure="tracemalloc", **options)
    CASES[reader] += 1
    OUTCOMES[reader][res.outcome] += 1
    if fuzz.is_failure(res):
        assert res.error is not None
        tb = "".join(traceback.format_exception(res.error))
        pytest.fail(f"{reader}: {res.outcome} on a {len(data)}-byte input {data[:64]!r}...:\n{tb}")


def fuzz_reader(reader: str) -> None:
    """EXAMPLES mutated seeds through `reader`; the outcomes are printed (`pytest -rP` shows them)."""
    seeds = SEEDS[reader]
    before = CASES[reader]
    outcomes_before = Counter(OUTCOMES[reader])

    @SETTINGS
    @given(seed=st.integers(0, len(seeds) - 1), ops=ops_for(reader), auto=st.booleans())
    def run(seed: int, ops: list[tuple[Any, ...]], auto: bool) -> None:
        check(reader, fuzz.apply_ops(seeds[seed], ops, reader, seeds), auto=auto)

    run()
    print(json.dumps({"reader": reader, "cases": CASES[reader] - before,
                      "outcomes": dict((OUTCOMES[reader] - outcomes_before).most_common())}))
    assert CASES[reader] - before >= EXAMPLES, (reader, CASES[reader] - before)


@pytest.mark.parametrize("reader", fuzz.READERS)
def test_seeds_are_valid_inputs(reader: str) -> None:
    """Mutations start from files every reader accepts (and that survive the whole exercise)."""
    for data in SEEDS[reader]:
        res = fuzz.run_case(reader, data, timeout=30, measure="tracemalloc")
        assert res.error is None, res.error


@pytest.mark.parametrize("reader", [r for r in fuzz.READERS if r != "recipe"])
def test_fuzz_reader(reader: str) -> None:
    fuzz_reader(reader)


def test_fuzz_files_through_the_file_source(tmp_path: Path) -> None:
    """The same checks through FileSource (pread and per-tensor mmaps) instead of a buffer."""
    path = tmp_path / "case.bin"

    @settings(SETTINGS, max_examples=max(EXAMPLES // 5, 10))
    @given(reader=st.sampled_from([r for r in fuzz.READERS if r != "recipe"]), data=st.data())
    def run(reader: str, data: st.DataObject) -> None:
        seeds = SEEDS[reader]
        seed = data.draw(st.integers(0, len(seeds) - 1))
        check(reader, fuzz.apply_ops(seeds[seed], data.draw(ops_for(reader)), reader, seeds), path=path)

    run()


def test_fuzz_recipe_text() -> None:
    fuzz_reader("recipe")


# Recipe values of every YAML type, placed anywhere in a valid recipe.
YAML_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                         st.sampled_from(["^a(", "[z-a]", "\\p{L}", "$1", "F16", "I8", "keep", "template", "..", "",
                                          "pytorch_to_burn", "half_precision", "\x00", "a.pt"]))
YAML_VALUES = st.recursive(YAML_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=3)),
    max_leaves=8)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


RECIPE_DATA = yaml.safe_load(fuzz.RECIPE_FULL)
RECIPE_PATHS = _paths(RECIPE_DATA)


@settings(SETTINGS, max_examples=max(EXAMPLES // 2, 10))  # PyYAML is pure Python: ~10 ms a case
@given(where=st.sampled_from(RECIPE_PATHS), value=YAML_VALUES, drop=st.booleans())
def test_fuzz_recipe_values(where: tuple[Any, ...], value: Any, drop: bool) -> None:
    """Any value (or none) at any place of a valid recipe: a RecipeError with a location, or a recipe."""
    import copy

    data = copy.deepcopy(RECIPE_DATA)
    parent = data
    for k in where[:-1]:
        parent = parent[k]
    if drop and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    check("recipe", text.encode("utf-8", "surrogatepass"))
    try:
        parse_recipe(text)
    except RecipeError as e:
        assert e.issues and all(i.line >= 0 for i in e.issues)
        if not drop and len(where) == 1 and where[0] != "description":
            assert any(i.line > 0 for i in e.issues), str(e)  # a top-level value is always locatable


# ----------------------------------------------------------------------------------------------
# the guards can fail


def test_harness_catches_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuzz, "exercise", lambda *a, **k: signal.pause())  # blocks until a signal comes
    res = fuzz.run_case("burnpack", b"x", timeout=0.3)
    assert res.outcome == "CaseTimeout" and fuzz.is_failure(res)  # the alarm ended the wait


def test_harness_catches_an_allocation_bomb(monkeypatch: pytest.MonkeyPatch) -> None:
    def bomb(*a: Any, **k: Any) -> None:
        buf = np.ones(100 << 20, dtype=np.uint8)  # 100 MiB from a 10-byte input
        raise FormatError(f"refused after allocating {buf.nbytes}")  # typed, but too late

    monkeypatch.setattr(fuzz, "exercise", bomb)
    res = fuzz.run_case("burnpack", b"0123456789", measure="tracemalloc")
    assert res.outcome == "AllocationExceeded" and fuzz.is_failure(res), res
    assert res.peak > 100 << 20


RSS_BOMB = """
import mmap, sys
sys.path.insert(0, sys.argv[1])
import fuzz
from migrator.core.errors import FormatError

def bomb(*a, **k):
    buf = mmap.mmap(-1, 100 << 20)
    buf.write(b"\\1" * (100 << 20))
    raise FormatError("refused after allocating 100 MiB")

fuzz.exercise = bomb
res = fuzz.run_case("burnpack", b"0123456789", measure="rss")
print(res.outcome, fuzz.is_failure(res), res.peak > 100 << 20)
"""


def test_harness_catches_an_allocation_bomb_by_rss() -> None:
    """In a fresh process: RSS in the test process moves with whatever earlier tests left mapped."""
    out = subprocess.run([sys.executable, "-c", RSS_BOMB, str(REPO / "tools")], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["AllocationExceeded", "True", "True"], out.stdout + out.stderr


def test_harness_tells_typed_from_untyped(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail_with(exc: BaseException) -> Any:
        def run(*a: Any, **k: Any) -> None:
            raise exc

        return run

    monkeypatch.setattr(fuzz, "exercise", fail_with(FormatError("bad")))
    assert not fuzz.is_failure(fuzz.run_case("burnpack", b"x"))
    for exc in (ValueError("x"), IndexError(), RecursionError(), MemoryError(), UnicodeDecodeError("utf-8", b"", 0, 1,
                                                                                                   "x")):
        monkeypatch.setattr(fuzz, "exercise", fail_with(exc))
        assert fuzz.is_failure(fuzz.run_case("burnpack", b"x")), exc


def test_harness_checks_results_not_only_errors() -> None:
    """A reader that 'succeeds' with a tensor whose bytes contradict its shape is a failure."""
    from migrator.core.bytesource import MemorySource
    from migrator.formats.base import Reader

    class Fake(Reader):
        format = "burnpack"

        def __init__(self, tensor: LazyTensor) -> None:
            self.source = MemorySource(b"")
            self.tensors, self.metadata, self.scalars = [tensor], {}, {}

    with pytest.raises(MigratorError):  # LazyTensor.data() checks the declared length itself
        fuzz._check_reader(Fake(LazyTensor("t", dtypes.F32, (2,), 8, loader=lambda: b"1234")), 100, None)
    with pytest.raises(fuzz.WrongResult, match="shape/dtype need 12"):
        fuzz._check_reader(Fake(LazyTensor("t", dtypes.F32, (3,), 8, loader=lambda: b"12345678")), 100, None)


# ----------------------------------------------------------------------------------------------
# regressions from fuzzing


def test_empty_tensor_with_a_huge_dimension_is_typed_in_numpy() -> None:
    """Found by tools/fuzz.py (pytorch-tar): shape (4601552919265804291, 0) is valid and empty, but
    numpy cannot make an array of it; that is a typed error, not numpy's ValueError."""
    t = LazyTensor("view", dtypes.F32, (4601552919265804291, 0), 0, loader=lambda: b"")
    assert t.data().nbytes == 0
    with pytest.raises(MigratorError, match="cannot be a numpy array"):
        t.numpy()


def test_transpose_of_an_empty_tensor_with_a_huge_dimension() -> None:
    """Found with the case above: casts.transpose2d handed numpy a shape it refuses (fixed in casts.py)."""
    t = LazyTensor("w", dtypes.F32, (1 << 62, 0), 0, loader=lambda: b"")
    assert casts.transpose2d(t).data().nbytes == 0


def test_fuzz_tool_smoke(tmp_path: Path) -> None:
    """tools/fuzz.py end to end (RLIMIT_AS backstop, peak-RSS budget, crash directory, JSON summary)."""
    for reader in ("burnpack", "pytorch-legacy"):  # the harness is under test here, not the readers: few cases
        report = tmp_path / f"{reader}.json"
        out = subprocess.run([sys.executable, str(REPO / "tools" / "fuzz.py"), "--reader", reader, "--cases", "20",
                              "--timeout", str(CASE_TIMEOUT),
                              "--seed", "5", "--report", str(report), "--crash-dir", str(tmp_path / "crashes")],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        summary = json.loads(report.read_text())
        assert summary["cases"] == 20 and summary["failures"] == []
        assert sum(summary["outcomes"].values()) == 20
        assert list((tmp_path / "crashes").iterdir()) == []


# ---- memory per created object, per container kind (SafeTensors JSON, burnpack CBOR) ---------------
# Each input repeats one small item until it is ~100 KB; opening it (or refusing it) must stay within
# the budget per input byte that SECURITY.md states. The readers' fixed allowance (`header_object_base`)
# is set to 0 here so that ~100 KB show the per-byte rate; tracemalloc counts exactly.

_ITEMS = 100_000


def _peak(monkeypatch: pytest.MonkeyPatch, data: bytes) -> int:
    from migrator.core.limits import Limits

    limits = Limits(header_object_base=0)
    tracemalloc.start()
    try:
        with contextlib.suppress(FormatError):  # refused (LimitExceededError, or after parsing): fine
            open_file(data, limits=limits).close()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _within_budget(data: bytes, peak: int) -> None:
    """16 x the input (SECURITY.md), plus 1 MiB for the interpreter's own allocations meanwhile."""
    assert peak <= 16 * len(data) + (1 << 20), f"{peak / len(data):.1f} bytes per input byte"


@pytest.mark.parametrize("item", [
    b"\xa0", b"\x80", b"\xbf\xff", b"\x9f\xff", b"\xa1\x00\x00", b"\x81\x00", b"\x60", b"\x40",
    b"\xc0\xa0", b"\xd8\x20\x80", b"\xf9\x3c\x00", b"\x19\x01\x00", b"\x1a\x00\x01\x00\x00",
], ids=lambda b: b.hex())
def test_cbor_memory_per_byte_within_budget(monkeypatch: pytest.MonkeyPatch, item: bytes) -> None:
    from migrator.formats import burnpack

    n = _ITEMS // len(item)
    junk = b"\x9a" + n.to_bytes(4, "big") + item * n
    meta = b"\xa2\x67tensors\xa0\x64junk" + junk
    body = b"NRUB" + struct.pack("<HI", 1, len(meta)) + meta
    data = body + bytes(burnpack.align(len(body)) - len(body))
    _within_budget(data, _peak(monkeypatch, data))


def test_cbor_distinct_texts_within_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two-byte texts, all different (so none is shared): ~50 bytes of str per 3 input bytes."""
    from migrator.formats import burnpack

    n = 30_000
    junk = b"\x9a" + n.to_bytes(4, "big") + b"".join(b"\x62" + i.to_bytes(2, "big") for i in range(n))
    meta = b"\xa2\x67tensors\xa0\x64junk" + junk
    body = b"NRUB" + struct.pack("<HI", 1, len(meta)) + meta
    data = body + bytes(burnpack.align(len(body)) - len(body))
    _within_budget(data, _peak(monkeypatch, data))


@pytest.mark.parametrize("item", [b'"%d":{},', b'"%d":[],', b'"%d":[[],[],[]],', b'"%d":"",', b'"%d":[1000,1000],',
                                  b'"%d":[{},{}],', b'"%d":[""," ",""],'], ids=lambda b: b.decode())
def test_json_metadata_memory_per_byte_within_budget(monkeypatch: pytest.MonkeyPatch, item: bytes) -> None:
    """Values in `__metadata__` that are not strings are refused, but only after json.loads built them."""
    parts, size, i = [], 0, 0
    while size < _ITEMS:
        parts.append(item % i)
        size += len(parts[-1])
        i += 1
    text = b'{"__metadata__":{' + b"".join(parts)[:-1] + b"}}"
    text += b" " * (-len(text) % 8)
    data = struct.pack("<Q", len(text)) + text
    _within_budget(data, _peak(monkeypatch, data))


def test_real_headers_fit_the_budget_with_room() -> None:
    """A 20k-tensor header of each format opens with the fixed allowance as it is (no refusal)."""
    from migrator.formats import burnpack, safetensors

    ts = [LazyTensor(f"model.layers.{i // 100}.mlp.experts.{i % 100}.w", dtypes.F32, (1,), 4, lambda: b"\0" * 4)
          for i in range(20_000)]
    for writer in (safetensors.SafetensorsWriter(ts), burnpack.BurnpackWriter(ts)):
        buf = io.BytesIO()
        writer.write_to(buf)
        assert len(open_file(buf.getvalue()).tensors) == 20_000


@pytest.mark.parametrize("reader", fuzz.DIFFERENTIAL_READERS)
def test_differential_fuzz_finds_no_difference(reader: str, tmp_path: Path) -> None:
    """A short `tools/fuzz.py --differential` run: the fast path and the reference parser agree on
    every mutated input, and the fast path is exercised (not only its fallback)."""
    import random

    summary = fuzz.run_differential(reader, 150, random.Random(3), 30.0, tmp_path, None)
    assert summary["differences"] == 0 and summary["timeouts"] == 0, summary
    assert summary["outcomes"].get("fast path", 0) > 0, summary


def test_differential_outcome_sees_a_difference() -> None:
    """The comparison can fail: a reader whose fast path drops the metadata differs from the reference."""
    from migrator.formats.safetensors import SafetensorsReader

    class Lossy(SafetensorsReader):
        def _bulk(self, header: Any) -> Any:
            got = super()._bulk(header)
            return None if got is None else ({}, *got[1:])

    data = fuzz.build_seeds("safetensors")
    with_meta = [d for d in data if b"__metadata__" in d and fuzz.fast_path_taken("safetensors", d)]
    assert with_meta
    shipped, reference = fuzz._header_reader_classes("safetensors")
    assert fuzz.differential_outcome(Lossy, with_meta[0]) != fuzz.differential_outcome(reference, with_meta[0])
    assert fuzz.differential_outcome(shipped, with_meta[0]) == fuzz.differential_outcome(reference, with_meta[0])


def test_gguf_differential_against_gguf_py(tmp_path: Path) -> None:
    """A short `tools/fuzz.py --reader gguf --differential` run: every mutated GGUF input migrator
    accepts reads the same in gguf-py (names, ggml types, shapes, stored bytes, key/values)."""
    pytest.importorskip("gguf")
    # in a process of its own, as the tool runs: gguf-py allocates whatever a mutated header claims (tens
    # of GB), which the tool's RLIMIT_AS backstop turns into a refusal; in this process it would be the
    # OOM killer's, and how far gguf-py gets before its time limit depends on the machine's load
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(REPO / "tools" / "fuzz.py"), "--reader", "gguf", "--differential",
                           "--cases", "300", "--seed", "5", "--timeout", "30", "--report", str(report),
                           "--crash-dir", str(tmp_path / "crashes")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads(report.read_text())
    assert summary["differences"] == 0 and summary["timeouts"] == 0, summary
    assert summary["outcomes"].get("same", 0) > 30, summary


def test_gguf_differential_sees_a_difference(tmp_path: Path) -> None:
    """The comparison can fail: shapes in GGUF's own order (not reversed) differ from gguf-py's."""
    pytest.importorskip("gguf")
    data = next(d for d in fuzz.build_seeds("gguf") if b"attn_q" in d)
    path = tmp_path / "s.gguf"
    path.write_bytes(data)
    ours, theirs = fuzz._migrator_gguf_facts(path, data), fuzz._gguf_py_facts(path)
    assert ours == theirs
    unreversed = ([(n, g, shape[::-1], raw) for n, g, shape, raw in ours[0]], ours[1])
    assert unreversed != theirs

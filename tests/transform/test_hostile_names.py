"""Names and numbers from files and recipes must not choose how much work or memory migrator spends:
a `stack` over indices 0 and 4,000,000,000, `split` into 2**63 parts (or 10^8 of a zero-size dim),
a 60,000-dot name under an ordinary pattern, a nested format spec in an `--each` target.

Oracles: the `safetensors` library's files (what a good run writes), and for refusals the typed
error, its exit code and what it names; memory is measured with tracemalloc.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tests.support.alarm import alarm
from tests.support.cli import migrate_in_process

st_numpy = pytest.importorskip("safetensors.numpy")


def recipe(tmp_path: Path, body: str, source: str = "m.safetensors") -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"version: 1\nsource: {{path: {source}}}\n{body}\ntarget: {{path: out.safetensors}}\n")
    return path


def run(*args: str) -> tuple[int, str]:
    p = migrate_in_process(*args)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stdout + p.stderr


# ------------------------------------------------------------------------------- stack with huge indices


@pytest.mark.parametrize(("indices", "said"), [
    ([0, 4_000_000_000], "index 1 is missing"),
    ([0, 18_446_744_073_709_551_615], "index 1 is missing"),  # u64's largest
    ([1, 3_000_000_000], "index 0 is missing"),
    ([0, 2, 2_999_999_999], "index 1 is missing"),
])
def test_stack_over_far_apart_indices_names_the_first_gap(tmp_path: Path, indices: list[int], said: str) -> None:
    st_numpy.save_file({f"h.{i}.w": np.full(3, i % 7, np.float32) for i in indices}, str(tmp_path / "m.safetensors"))
    r = recipe(tmp_path, "ops:\n  - stack: {from: 'h\\.(\\d+)\\.w', over: 1, dim: 0, to: 'h.w'}")
    tracemalloc.start()
    try:
        code, out = run("plan", str(r))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2 and said in out and "r.yaml:4" in out, out  # an op's error: at its recipe line
    assert peak < 64 << 20, peak
    assert len(out) < 10_000


def test_stack_with_an_index_given_twice(tmp_path: Path) -> None:
    st_numpy.save_file({"h.0.w": np.zeros(2, np.float32), "h.00.w": np.ones(2, np.float32),
                        "h.1.w": np.ones(2, np.float32)}, str(tmp_path / "m.safetensors"))
    r = recipe(tmp_path, "ops:\n  - stack: {from: 'h\\.(\\d+)\\.w', over: 1, dim: 0, to: 'h.w'}")
    code, out = run("plan", str(r))
    assert code == 2 and "index 0 appears twice" in out, out


def test_stack_that_is_fine_matches_numpy(tmp_path: Path) -> None:
    arrays = {f"h.{i}.w": np.random.default_rng(i).standard_normal(3).astype(np.float32) for i in range(3)}
    st_numpy.save_file(arrays, str(tmp_path / "m.safetensors"))
    r = recipe(tmp_path, "ops:\n  - stack: {from: 'h\\.(\\d+)\\.w', over: 1, dim: 0, to: 'h.w'}")
    code, out = run("run", str(r))
    assert code == 0, out
    got = st_numpy.load_file(str(tmp_path / "out.safetensors"))
    assert np.array_equal(got["h.w"], np.stack([arrays[f"h.{i}.w"] for i in range(3)]))


# ------------------------------------------------------------------------------- split parts


@pytest.mark.parametrize("parts", ["100000000", str(2**63), str(2**64 + 5), "65537"])
def test_split_parts_are_capped_like_unstack(tmp_path: Path, parts: str) -> None:
    st_numpy.save_file({"x": np.zeros((0, 4), np.float32)}, str(tmp_path / "m.safetensors"))
    r = recipe(tmp_path, f"ops:\n  - split: {{from: x, dim: 0, parts: {parts}, to: 'x.$i'}}")
    tracemalloc.start()
    try:
        code, out = run("plan", str(r))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2 and "at most 65536" in out and "r.yaml:" in out, out
    assert peak < 64 << 20, peak


def test_split_sizes_list_is_capped(tmp_path: Path) -> None:
    st_numpy.save_file({"x": np.zeros((0, 4), np.float32)}, str(tmp_path / "m.safetensors"))
    sizes = ", ".join(["0"] * 70_000)
    r = recipe(tmp_path, f"ops:\n  - split: {{from: x, dim: 0, sizes: [{sizes}], to: 'x.$i'}}")
    code, out = run("plan", str(r))
    assert code == 2 and "at most 65536" in out, out


def test_split_at_the_cap_still_works(tmp_path: Path) -> None:
    st_numpy.save_file({"x": np.arange(8, dtype=np.float32).reshape(4, 2)}, str(tmp_path / "m.safetensors"))
    r = recipe(tmp_path, "ops:\n  - split: {from: x, dim: 0, parts: 4, to: 'x.$i'}")
    code, out = run("run", str(r))
    assert code == 0, out
    got = st_numpy.load_file(str(tmp_path / "out.safetensors"))
    assert [got[f"x.{i}"].tolist() for i in range(4)] == [[[2 * i, 2 * i + 1]] for i in range(4)]


# ------------------------------------------------------------------------------- long names


LONG = "a." * 30_000 + "weight"  # 60,000 dots: (.*)\.weight$ backtracks quadratically in Python's re
LONG_GAMMA = "a." * 30_000 + "gamma"


@pytest.mark.parametrize(("args", "wanted"), [
    (["convert", "m.safetensors", "o.safetensors", "--include", r"(.*)\.weight$"], {LONG: 0, "b.weight": 1}),
    (["convert", "m.safetensors", "o.safetensors", "--include", r"(.*)\.gamma$"], {LONG_GAMMA: 2}),
    (["convert", "m.safetensors", "o.safetensors", "--remap", r"(.*)\.weight$=${1}.w"],
     {LONG[:-len("weight")] + "w": 0, "b.w": 1, LONG_GAMMA: 2}),
    (["convert", "m.safetensors", "o.safetensors", "--remap", r"(.*)\.gamma$=${1}.g"],
     {LONG: 0, "b.weight": 1, LONG_GAMMA[:-len("gamma")] + "g": 2}),
    (["convert", "m.safetensors", "o.safetensors", "--exclude", r"^(a\.)*b$"], {LONG: 0, "b.weight": 1, LONG_GAMMA: 2}),
])
def test_a_60000_segment_name_is_matched_in_linear_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        args: list[str], wanted: dict[str, int]) -> None:
    monkeypatch.chdir(tmp_path)
    tensors = {LONG: np.zeros(2, np.float32), "b.weight": np.ones(2, np.float32), LONG_GAMMA: np.full(2, 2, np.float32)}
    st_numpy.save_file(tensors, "m.safetensors")
    # Python's re took 13 s per pattern and name here; RE2 well under one
    with alarm(20, "a long name under an ordinary pattern"):
        code, out = run(*args)
    assert code == 0, out[:2000]
    got = st_numpy.load_file("o.safetensors")
    assert sorted(got) == sorted(wanted)
    for name, value in wanted.items():
        assert got[name].tolist() == [float(value)] * 2


def test_ops_from_a_pattern_on_a_60000_segment_name(tmp_path: Path) -> None:
    names = [f"{'s.' * 30_000}h.{i}.weight" for i in range(2)]
    st_numpy.save_file({n: np.full((1, 2), i, np.float32) for i, n in enumerate(names)},
                       str(tmp_path / "m.safetensors"))
    r = recipe(tmp_path, "ops:\n  - stack: {from: '(.*)\\.h\\.(\\d+)\\.weight', over: 2, dim: 0, to: '$1.w'}")
    with alarm(20, "an op over long names"):
        code, out = run("run", str(r))
    assert code == 0, out[:2000]
    got = st_numpy.load_file(str(tmp_path / "out.safetensors"))
    assert list(got) == ["s." * 29_999 + "s.w"] and got["s." * 29_999 + "s.w"].tolist() == [[[0.0, 0.0]], [[1.0, 1.0]]]


def test_catastrophic_patterns_return_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nested quantifiers on a 31-character name: exponential in a backtracking engine, linear on RE2."""
    monkeypatch.chdir(tmp_path)
    name = "a" * 30 + "!"
    st_numpy.save_file({name: np.zeros(2, np.float32)}, "m.safetensors")
    for pattern in [r"^(a+)+$", r"^(a|a)*$", r"^(a*)*b$", r"(.*a){12}$", r"^(\w+\s?)*$"]:
        with alarm(20, f"{pattern} on a 31-character name"):
            code, out = run("convert", "m.safetensors", "o.safetensors", "--include", pattern, "--overwrite")
        assert code == 0 and "0 tensors" in out, (pattern, out)  # none of them matches the name


def test_a_collision_of_long_names_is_one_short_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    st_numpy.save_file({LONG: np.zeros(2, np.float32), LONG_GAMMA: np.ones(2, np.float32)}, "m.safetensors")
    code, out = run("convert", "m.safetensors", "o.safetensors", "--remap", r"\.gamma$=.weight")
    assert code == 1 and "map to the same name" in out and "characters)" in out, out[:3000]
    assert len(out) < 3000 and out.count("\n") == 1
    assert not (tmp_path / "o.safetensors").exists()


def test_a_name_cap_is_still_there_for_who_wants_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    name = "a." * 1000 + "weight"  # 2006 characters
    st_numpy.save_file({name: np.arange(2, dtype=np.float32)}, "m.safetensors")
    code, out = run("convert", "m.safetensors", "o.safetensors", "--include", "weight$", "--limit",
                    "max_name_chars=1024")
    assert code == 1 and "max_name_chars" in out and "2,006 characters" in out and len(out) < 2000
    assert not (tmp_path / "o.safetensors").exists()
    code, out = run("convert", "m.safetensors", "o.safetensors", "--include", "weight$")
    assert code == 0, out
    assert st_numpy.load_file("o.safetensors")[name].tolist() == [0.0, 1.0]


# ------------------------------------------------------------------------------- --each format specs


@pytest.mark.parametrize("target", ["out/{i:{stem}}.safetensors", "out/{stem:{i}}.safetensors",
                                    "out/{i:>900000000}.safetensors", "out/{i:0{parent}}.safetensors"])
def test_each_target_format_specs_are_literal_and_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         target: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "900000000").mkdir()
    st_numpy.save_file({"w": np.zeros(2, np.float32)}, str(tmp_path / "900000000" / "900000000.safetensors"))
    r = tmp_path / "r.yaml"
    r.write_text("version: 1\nsource: {path: x.safetensors}\ntarget: {path: y.safetensors}\n")
    tracemalloc.start()
    try:
        code, out = run("run", str(r), "--each", "900000000/*.safetensors", "--target", target)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2 and "--target" in out, out
    assert peak < 64 << 20, peak
    assert not (tmp_path / "out").exists()


def test_each_target_with_a_literal_padding_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for n in ("a", "b"):
        st_numpy.save_file({"w": np.full(2, ord(n), np.float32)}, f"{n}.safetensors")
    r = tmp_path / "r.yaml"
    r.write_text("version: 1\nsource: {path: x.safetensors}\ntarget: {path: y.safetensors}\n")
    code, out = run("run", str(r), "--each", "*.safetensors", "--target", "out/{i:03}-{stem}.safetensors")
    assert code == 0, out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["000-a.safetensors", "001-b.safetensors"]
    assert st_numpy.load_file("out/001-b.safetensors")["w"].tolist() == [98.0, 98.0]

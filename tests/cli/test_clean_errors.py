"""Inputs that used to end in a traceback end in a clean error with the README's exit code (2: usage
or an invalid recipe, 1: data), or in a correct result; and `diff --json` stays strict JSON.

Oracles: the `safetensors` library (files written, files read back), numpy's differences, and
Python's strict JSON parser (no NaN/Infinity constants).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cli import migrate_in_process

st_numpy = pytest.importorskip("safetensors.numpy")

F64_MAX = np.finfo(np.float64).max


def run(*args: str) -> tuple[int, str, str]:
    p = migrate_in_process(*args)
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    st_numpy.save_file({"a": np.arange(6, dtype=np.float32), "b": np.ones(3, np.float64)}, "m.safetensors")
    return tmp_path


# ------------------------------------------------------------------------------- sizes and windows


@pytest.mark.parametrize("args", [
    ["convert", "m.safetensors", "o.safetensors", "--max-shard-size", "-5"],
    ["convert", "m.safetensors", "o.safetensors", "--max-shard-size", "0"],
    ["diff", "m.safetensors", "m.safetensors", "--window", "-5"],
    ["diff", "m.safetensors", "m.safetensors", "--window", "0"],
])
def test_bad_sizes_on_the_command_line_are_usage_errors(here: Path, args: list[str]) -> None:
    code, _, err = run(*args)
    assert code == 2 and ("--max-shard-size" in err or "--window" in err), err


@pytest.mark.parametrize("size", ["-5", "0", "-1GB"])
def test_bad_shard_size_in_a_recipe_is_a_recipe_error(here: Path, size: str) -> None:
    Path("r.yaml").write_text(f"version: 1\nsource: {{path: m.safetensors}}\n"
                              f"target: {{path: out, shard: {{max_size: '{size}'}}}}\n")
    code, _, err = run("run", "r.yaml")
    assert code == 2 and "r.yaml:3" in err and "max_size" in err, err


@pytest.mark.parametrize("window", ["1", "3", "5", "7"])
def test_diff_windows_smaller_than_an_element(here: Path, window: str) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal(50).astype(np.float32)
    b = a.copy()
    b[[3, 17, 41]] += np.float32(0.5)
    st_numpy.save_file({"w": a, "z": np.zeros(4, np.float64)}, "a.safetensors")
    st_numpy.save_file({"w": b, "z": np.zeros(4, np.float64)}, "b.safetensors")
    code, out, err = run("diff", "a.safetensors", "b.safetensors", "--window", window, "--json")
    assert code == 1, err
    doc = {t["name"]: t for t in strict_json(out)["tensors"]}
    assert doc["w"]["differing"] == 3 and doc["w"]["first_index"] == [3]
    assert doc["w"]["max_abs_diff"] == float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
    assert doc["z"]["status"] == "identical"


# ------------------------------------------------------------------------------- split parts


@pytest.mark.parametrize("parts", [str(2**63), str(2**63 - 1), str(10**30)])
def test_split_parts_beyond_any_size_is_a_recipe_error(here: Path, parts: str) -> None:
    st_numpy.save_file({"z": np.zeros((0, 3), np.float32)}, "z.safetensors")  # 0 divides into any count
    Path("r.yaml").write_text("version: 1\nsource: {path: z.safetensors}\nops:\n"
                              f"  - split: {{from: z, dim: 0, parts: {parts}, to: 'z.$i'}}\ntarget: {{path: o.bpk}}\n")
    code, _, err = run("run", "r.yaml")
    assert code == 2 and "r.yaml:4" in err and "parts" in err, err


# ------------------------------------------------------------------------------- index numbers beyond int()'s limit


HUGE = "7" * 4400  # Python refuses int() of 4,300+ digits


@pytest.fixture
def huge(here: Path) -> Path:
    st_numpy.save_file({f"layer.{HUGE}.w": np.zeros(2, np.float32), "layer.1.w": np.ones(2, np.float32)},
                       "huge.safetensors")
    return here


LONG_NAMES = ["--limit", "max_name_chars=100000"]  # let the 4,408-character name reach the index parsing


def test_index_arithmetic_on_a_huge_number(huge: Path) -> None:
    Path("r.yaml").write_text("version: 1\nsource: {path: huge.safetensors}\nremap:\n"
                              "  - {from: '^layer\\.(\\d+)\\.', to: 'layer.${1+1}.'}\ntarget: {path: o.safetensors}\n")
    code, _, err = run("run", "r.yaml", *LONG_NAMES)
    assert code in (1, 2) and "4400 digits" in err and "2^64" in err, err
    assert not Path("o.safetensors").exists()


def test_contiguous_indices_leave_a_huge_number_alone(huge: Path) -> None:
    """Renumbering takes indices of 64 bits (Burn's usize), like Burn: a longer run of digits is a
    plain name segment, as in Burn's renumbering."""
    code, _, err = run("convert", "huge.safetensors", "o.bpk", "--contiguous-indices", *LONG_NAMES)
    assert code == 0, err
    from migrator import open_file

    with open_file("o.bpk") as r:
        assert sorted(t.name for t in r.tensors) == sorted(["layer.0.w", f"layer.{HUGE}.w"])


def test_contiguous_indices_of_a_huge_number_in_python() -> None:
    from migrator.naming import contiguous_names, parse_usize

    assert parse_usize(HUGE) is None and parse_usize("0" * 5000 + "7") == 7
    assert parse_usize("2" * 20) is None and parse_usize("1" * 20) == int("1" * 20)  # around 2^64
    assert contiguous_names([f"h.{HUGE}.w", "h.5.w"]) == [f"h.{HUGE}.w", "h.0.w"]


def test_a_4408_character_name_needs_no_limit_now(huge: Path) -> None:
    """Patterns run on RE2 in linear time: the default cap on names (`max_name_chars`, 65,536) is far
    above such a name; a lower one refuses it."""
    code, _, err = run("convert", "huge.safetensors", "o.bpk", "--contiguous-indices")
    assert code == 0, err
    code, _, err = run("convert", "huge.safetensors", "o2.bpk", "--contiguous-indices",
                       "--limit", "max_name_chars=1024")
    assert code == 1 and "max_name_chars" in err, err


# ------------------------------------------------------------------------------- URLs and paths


@pytest.mark.parametrize("url", ["zip://x::PATH", "zip://m.safetensors", "tar://a::m.safetensors",
                                 "s3://b/k::file://m.safetensors", "ftp://host/m.safetensors"])
def test_unsupported_and_chained_urls_are_clean_errors(here: Path, url: str) -> None:
    code, _, err = run("inspect", url)
    assert code == 1 and "unsupported URL" in err, err
    code, out, _ = run("inspect", url, "--json")
    assert code == 1 and "unsupported URL" in strict_json(out)["error"]["message"]


@pytest.mark.parametrize("spelled", ["file://{p}", "file:{p}", "FILE://{p}", "file://{q}"])
def test_file_urls_name_local_files(here: Path, spelled: str) -> None:
    out = here / "sub dir" / "o.safetensors"
    target = spelled.format(p=out, q=str(out).replace(" ", "%20"))
    code, _, err = run("convert", "m.safetensors", target)
    assert code == 0, err
    assert st_numpy.load_file(str(out))["a"].tolist() == list(range(6))
    assert not any(p.name.lower().startswith("file:") for p in here.rglob("*")), list(here.rglob("*"))
    code, text, err = run("inspect", target)
    assert code == 0 and "a" in text, err


def test_file_url_as_a_recipe_target_and_run_override(here: Path) -> None:
    Path("r.yaml").write_text(f"version: 1\nsource: {{path: 'file://{here}/m.safetensors'}}\n"
                              f"target: {{path: 'file://{here}/t/r.safetensors'}}\n")
    code, _, err = run("run", "r.yaml")
    assert code == 0, err
    code, _, err = run("run", "r.yaml", "--target", f"file://{here}/t/o.safetensors")
    assert code == 0, err
    assert (here / "t" / "r.safetensors").is_file() and (here / "t" / "o.safetensors").is_file()
    assert not any(p.name.lower().startswith("file:") for p in here.rglob("*"))


# ------------------------------------------------------------------------------- strict JSON from diff


@pytest.mark.parametrize(("a", "b"), [
    ([F64_MAX, 0.0], [-F64_MAX, 0.0]),  # |a - b| overflows float64
    ([1e300, 1.0], [5e-324, 1.0]),  # |a - b| / |b| overflows
    ([F64_MAX, -F64_MAX], [-F64_MAX, F64_MAX]),
])
def test_diff_json_never_holds_infinity(here: Path, a: list[float], b: list[float]) -> None:
    st_numpy.save_file({"x": np.array(a, np.float64)}, "a.safetensors")
    st_numpy.save_file({"x": np.array(b, np.float64)}, "b.safetensors")
    for extra in ([], ["--atol", "1"], ["--rtol", "0.5"]):
        code, out, err = run("diff", "a.safetensors", "b.safetensors", "--json", *extra)
        assert code == 1, err
        x = strict_json(out)["tensors"][0]
        assert x["status"] == "different" and x["differing"] >= 1
        assert math.isfinite(x["max_abs_diff"]) and math.isfinite(x["max_rel_diff"])
        assert F64_MAX in (x["max_abs_diff"], x["max_rel_diff"])  # beyond float64: shown as its largest value
    code, _, err = run("diff", "a.safetensors", "b.safetensors", "--html", "d.html")
    assert code == 1 and os.path.getsize("d.html") > 0, err

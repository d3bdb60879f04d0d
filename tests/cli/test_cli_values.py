"""Command-line values a recipe would refuse at its LINE:COL are usage errors on the command line:
exit 2, a one-line message naming the option, JSON with --json, never a traceback (issue 25 items
7, 10 and 11)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, save
from tests.support.cli import migrate_in_process as migrate


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "m.safetensors"
    save([from_numpy("w", np.arange(6, dtype=np.float32).reshape(2, 3))], path)
    return path


@pytest.mark.parametrize(("size", "message"), [
    ("2XB", "cannot read size '2XB'"), ("0", "must be positive"), ("-5", "cannot read size"),
    ("0.5KB", "cannot read size"),
])
def test_bad_shard_size_is_a_usage_error(src: Path, tmp_path: Path, size: str, message: str) -> None:
    r = migrate("convert", str(src), str(tmp_path / "out") + "/", "--max-shard-size", size)
    assert r.returncode == 2 and "--max-shard-size: " in r.stderr and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()
    r = migrate("convert", str(src), str(tmp_path / "out") + "/", "--max-shard-size", size, "--json")
    assert r.returncode == 2
    error = json.loads(r.stdout)["error"]
    assert error["kind"] == "UsageError" and message in error["message"]


@pytest.mark.parametrize("args", [["--to", "gguf2"], ["--from", "onnx"]])
def test_unknown_format_names_are_usage_errors_listing_the_formats(src: Path, tmp_path: Path,
                                                                  args: list[str]) -> None:
    r = migrate("convert", str(src), str(tmp_path / "x"), *args)
    assert r.returncode == 2, r.stderr
    assert "unknown format" in r.stderr and "burnpack, safetensors, pytorch" in r.stderr


def test_unknown_target_extension_is_a_usage_error(src: Path, tmp_path: Path) -> None:
    r = migrate("convert", str(src), str(tmp_path / "x.weird"))
    assert r.returncode == 2 and "extension '.weird'" in r.stderr and "--to burnpack|" in r.stderr
    assert not (tmp_path / "x.weird").exists()


@pytest.mark.parametrize("spelling", ["FP16", "fp16", "float16", "Float16", "half", "F16", "torch.float16"])
def test_common_dtype_spellings_are_accepted(src: Path, tmp_path: Path, spelling: str) -> None:
    from safetensors.numpy import load_file

    out = tmp_path / "o.safetensors"
    r = migrate("convert", str(src), str(out), "--dtype", spelling)
    assert r.returncode == 0, r.stderr
    assert load_file(out)["w"].dtype == np.float16


def test_an_unknown_dtype_suggests_one(src: Path, tmp_path: Path) -> None:
    r = migrate("convert", str(src), str(tmp_path / "o.safetensors"), "--dtype", "FP61")
    assert r.returncode == 2 and "unknown dtype 'FP61'" in r.stderr and "F16" in r.stderr


def test_merge_config_that_cannot_be_read_is_a_usage_error(tmp_path: Path) -> None:
    r = migrate("merge", str(tmp_path / "missing.yml"), str(tmp_path / "out") + "/")
    assert r.returncode == 2 and "cannot read the merge config" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    r = migrate("merge", str(tmp_path / "missing.yml"), str(tmp_path / "out") + "/", "--json")
    assert r.returncode == 2 and "cannot read the merge config" in r.stdout

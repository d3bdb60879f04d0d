"""One model in two schemes: the same tiny Llama quantized to fine-grained FP8 (DeepSeek's 32x32 block
scales, F32) and to compressed-tensors' float-quantized block strategy (by compressed-tensors itself, BF16
scales). `diff --dtype` dequantizes both sides; the largest difference it reports per weight is the one
torch computes between compressed-tensors' own dequantizations of the two folders, exact mode fails and
`--atol` just above that largest difference passes. `inspect` names each scheme with the sizes torch counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.quantized import ct_float_dequantized, ct_float_folder, fp8_dequantized, fp8_folder

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")


def oracle_fp8(stored: dict) -> dict:
    return fp8_dequantized(stored, torch.float32)


def oracle_ct(stored: dict, qc: dict) -> dict:
    return ct_float_dequantized(stored, qc, torch.float32)


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path, dict, dict]:
    fp8, fp8_stored = fp8_folder(tmp_path / "fp8")
    ct, ct_stored, qc = ct_float_folder(tmp_path / "ct", "block", block=(32, 32), ignore=("lm_head",))
    return fp8, ct, oracle_fp8(fp8_stored), oracle_ct(ct_stored, qc)


def test_diff_across_schemes_reports_torchs_differences(two: tuple[Path, Path, dict, dict]) -> None:
    fp8, ct, a, b = two
    assert sorted(a) == sorted(b) and len(a) == 14
    p = migrate_in_process("diff", str(fp8), str(ct), "--dtype", "F32", "--json")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr  # exact: they differ
    doc = json.loads(p.stdout)
    by_name = {t["name"]: t for t in doc["tensors"]}
    assert not [n for n in by_name if "_scale" in n]  # both sides' scales consumed, not compared
    worst = 0.0
    for name in a:
        want = (a[name] - b[name]).abs().max().item()
        assert by_name[name]["max_abs_diff"] == pytest.approx(want, rel=0, abs=0), name
        worst = max(worst, want)
    assert worst > 0
    ok = migrate_in_process("diff", str(fp8), str(ct), "--dtype", "F32", "--atol", repr(worst * 1.01))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    tight = migrate_in_process("diff", str(fp8), str(ct), "--dtype", "F32", "--atol", repr(worst * 0.99))
    assert tight.returncode == 1, tight.stdout


def test_inspect_names_each_scheme_with_torchs_sizes(two: tuple[Path, Path, dict, dict]) -> None:
    from safetensors.torch import load_file

    for folder, scheme, part in ((two[0], "fine-grained FP8", "_scale_inv"), (two[1], "compressed-tensors", "_scale")):
        p = migrate_in_process("inspect", str(folder), "--json")
        assert p.returncode == 0, p.stderr
        q = json.loads(p.stdout)["details"]["quantization"]
        assert scheme in q["description"] and q["weights"] == 14 and q["consumed"] == 14
        stored: dict = {}
        for f in folder.glob("*.safetensors"):
            stored.update(load_file(str(f)))
        weights = [n for n in stored if n + part in stored]
        assert q["stored_bytes"] == sum(stored[n].nbytes + stored[n + part].nbytes for n in weights)
        assert q["dequantized_bytes"]["F32"] == sum(stored[n].numel() * 4 for n in weights)

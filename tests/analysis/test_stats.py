"""`inspect --stats` against numpy's float64 statistics, on files torch and safetensors wrote.

Each dtype goes through every path: the compiled loop (AVX2 and portable), and numpy alone.
Windows are made small so the per-window merge is exercised many times per tensor.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migrator import open_file
from migrator.analysis.stats import tensor_stats
from migrator.cli import main
from migrator.core import native
from tests.support.fixtures import SHARED_FIXTURES, fixture_file

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

KEYS = {"min", "max", "mean", "std", "mean_abs", "zeros_fraction", "nan", "inf", "flags"}


@pytest.fixture(params=["avx2", "portable", "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    kernels = native.kernels
    if request.param == "numpy":
        monkeypatch.setattr(native, "kernels", None)
    elif kernels is None:
        pytest.skip("compiled kernels not built")
    elif request.param == "portable":
        kernels.use_f16c(False)
        request.addfinalizer(lambda: kernels.use_f16c(True))
    return request.param


def oracle(x: np.ndarray) -> dict[str, Any]:
    """numpy's statistics of `x` in float64, over the finite values (ints: min/max/mean)."""
    flat = x.reshape(-1)
    if flat.dtype.kind in "iub":
        ints = flat.astype(np.int64) if flat.dtype.kind != "u" else flat.astype(np.uint64)
        return {"min": int(ints.min()), "max": int(ints.max()), "mean": float(ints.astype(np.float64).mean()),
                "std": None, "mean_abs": None, "zeros_fraction": float(np.mean(flat == 0)), "nan": 0, "inf": 0}
    v = flat.astype(np.float64)
    finite = v[np.isfinite(v)]
    with np.errstate(over="ignore"):
        mean, std, mean_abs = (float(finite.mean()), float(finite.std()), float(np.abs(finite).mean())) \
            if len(finite) else (None, None, None)
    return {"min": float(finite.min()) if len(finite) else None, "max": float(finite.max()) if len(finite) else None,
            "mean": mean if mean is not None and math.isfinite(mean) else None,
            "std": std if std is not None and math.isfinite(std) else None,
            "mean_abs": mean_abs if mean_abs is not None and math.isfinite(mean_abs) else None,
            "zeros_fraction": float(np.mean(v == 0)), "nan": int(np.isnan(v).sum()), "inf": int(np.isinf(v).sum())}


def assert_matches(got: dict[str, Any] | None, want: dict[str, Any], label: str) -> None:
    assert got is not None, label
    assert set(got) == KEYS, label
    for key, expected in want.items():
        value = got[key]
        if key in ("nan", "inf", "min", "max") or expected is None:  # exact (min/max: ints stay ints)
            assert value == expected and type(value) is type(expected), (label, key, value, expected)
        else:
            assert value == pytest.approx(expected, rel=1e-9, abs=1e-12), (label, key, value, expected)


def as_numpy(t: Any) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def generated() -> dict[str, Any]:
    """Seeded tensors of every numeric dtype, floats with NaN, infinities, zeros and -0.0."""
    g = torch.Generator().manual_seed(7)
    base = torch.randn(40_003, generator=g, dtype=torch.float64) * 3 + 0.5
    floats = base.clone()
    floats[[5, 999, 20_000]] = float("nan")
    floats[[17, 30_000]] = float("inf")
    floats[31_000] = float("-inf")
    floats[100:140] = 0.0
    floats[141] = -0.0
    out: dict[str, Any] = {f"f.{d}": floats.to(getattr(torch, d))
                           for d in ("float64", "float32", "float16", "bfloat16")}
    out["shifted.float32"] = (torch.randn(30_000, generator=g) * 1e-3 + 1000.0).float()  # mean >> std
    out["finite.float32"] = base[:40_000].float().reshape(200, 200)
    ints = (base * 1000).round()
    for d in ("int64", "int32", "int16", "int8", "uint8"):
        info = torch.iinfo(getattr(torch, d))
        out[f"i.{d}"] = ints.clamp(info.min, info.max).to(getattr(torch, d))
    out["bool"] = base > 0
    return out


def test_generated_tensors_match_numpy(tmp_path: Path, path: str) -> None:
    tensors = generated()
    f = tmp_path / "g.safetensors"
    save_file(tensors, str(f))
    with open_file(f) as r:
        for t in r.tensors:
            for window in (4096, 1 << 20):
                assert_matches(tensor_stats(t, window), oracle(as_numpy(tensors[t.name])), f"{t.name} {window}")


def test_fixture_files_match_numpy(shared_fixtures: Path, path: str) -> None:
    from safetensors.numpy import load_file

    st = fixture_file("safetensors", "multi_layer.safetensors")
    arrays = load_file(str(st))
    with open_file(st) as r:
        for t in r.tensors:
            assert_matches(tensor_stats(t, 64), oracle(arrays[t.name]), t.name)
    compared = 0
    for pt in sorted((SHARED_FIXTURES / "pytorch").glob("*.pt")):
        if pt.name in ("broken.pt",) or "legacy" in pt.name:
            continue
        loaded = torch.load(pt, weights_only=True, map_location="cpu")
        with open_file(pt) as r:
            for t in r.tensors:
                obj: Any = loaded
                for part in t.name.split("."):
                    obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
                if not isinstance(obj, torch.Tensor) or obj.is_complex() or obj.numel() == 0:
                    continue
                assert_matches(tensor_stats(t, 64), oracle(as_numpy(obj.contiguous())), f"{pt.name}:{t.name}")
                compared += 1
    assert compared >= 30


def test_flags(tmp_path: Path, path: str) -> None:
    tensors = {"zeros": torch.zeros(1000), "ones": torch.ones(5000, dtype=torch.float16),
               "nan": torch.tensor([1.0, float("nan")]), "inf": torch.tensor([float("-inf"), 2.0]),
               "all_nan": torch.full((3,), float("nan")), "int_same": torch.full((9,), 4, dtype=torch.int32),
               "one": torch.tensor([3.0]), "fine": torch.arange(10.0), "empty": torch.zeros(0)}
    f = tmp_path / "flags.safetensors"
    save_file(tensors, str(f))
    with open_file(f) as r:
        got = {t.name: tensor_stats(t, 64) for t in r.tensors}
    flags = {k: v["flags"] for k, v in got.items() if v is not None}
    assert flags == {"zeros": ["all_zeros"], "ones": ["all_equal"], "nan": ["has_nan"], "inf": ["has_inf"],
                     "all_nan": ["has_nan"], "int_same": ["all_equal"], "one": [], "fine": [], "empty": []}
    assert got["all_nan"]["min"] is None and got["all_nan"]["mean"] is None and got["all_nan"]["nan"] == 3
    assert got["empty"]["zeros_fraction"] is None and got["empty"]["min"] is None


def test_cli_stats_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "m.safetensors"
    save_file({"a": torch.zeros(4, 4), "b": torch.arange(6, dtype=torch.int64)}, str(f))
    assert main(["inspect", str(f), "--stats", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    a, b = sorted(doc["tensors"], key=lambda t: t["name"])
    assert a["flags"] == ["all_zeros"] and set(a["stats"]) == KEYS - {"flags"}
    assert b["stats"]["min"] == 0 and b["stats"]["max"] == 5 and isinstance(b["stats"]["max"], int)
    assert b["stats"]["mean"] == 2.5 and b["flags"] == []
    assert doc["totals"]["flagged"] == {"all_zeros": 1}
    assert main(["inspect", str(f), "--stats"]) == 0
    text = capsys.readouterr().out
    assert "all zeros" in text and "mean |x|" in text and "flagged all zeros: 1 tensor" in text

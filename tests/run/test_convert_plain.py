"""A plain `convert` (nothing renamed, filtered, adapted or cast) skips the recipe machinery; it must
write exactly what the recipe path writes, report the same, and fail the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from migrator import from_numpy, open_file, save
from migrator.core.errors import MigratorError
from migrator.core.scalars import Scalar
from migrator.run import convert as convert_module

torch = pytest.importorskip("torch")


def _recipe_path(src: Path, dst: Path, **options: Any) -> convert_module.ConvertResult:
    """The general path, whatever the options."""
    from migrator.plan.build import build_plan
    from migrator.run.execute import run_plan

    recipe = convert_module.build_recipe(src, dst, **options)
    with build_plan(recipe, Path.cwd()) as plan:
        return convert_module._result(plan, run_plan(plan, progress=False).target)


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    tensors = [from_numpy("enc.0.weight", np.arange(12, dtype=np.float32).reshape(3, 4), param_id=3),
               from_numpy("enc.0.bias", np.ones(3, ml_dtypes.bfloat16)),
               from_numpy("steps", np.array([1, 2], np.int64)),
               from_numpy("mask", np.array([True, False, True]))]
    out = {"bpk": tmp_path / "src.bpk", "safetensors": tmp_path / "src.safetensors", "pt": tmp_path / "src.pt"}
    save(tensors, out["bpk"], metadata={"producer": "burn", "format": "burnpack", "note": "x"},
         scalars={"epoch": Scalar("UInt", 7), "lr": Scalar("Float", 0.5)})
    save(tensors, out["safetensors"], metadata={"format": "pt", "note": "y"})
    torch.save({"enc.0.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                "enc.0.bias": torch.ones(3, dtype=torch.bfloat16), "steps": torch.tensor([1, 2]),
                "mask": torch.tensor([True, False, True]), "epoch": 3}, out["pt"])
    return out


OPTION_SETS: list[dict[str, Any]] = [
    {},
    {"clear_metadata": True},
    {"metadata": {"k": "v", "format": "mine"}},
    {"fsync": False, "overwrite": True},
    {"remaps": [], "includes": [], "adapters": [], "dtype": None, "contiguous_indices": False},  # all unset
]


@pytest.mark.parametrize("options", OPTION_SETS)
@pytest.mark.parametrize("target", ["bpk", "safetensors", "pt"])
@pytest.mark.parametrize("source", ["bpk", "safetensors", "pt"])
def test_plain_copy_writes_and_reports_what_the_recipe_path_does(
        sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, target: str,
        options: dict[str, Any]) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[str] = []
    real = convert_module._plain_copy

    def spy(*args: Any, **kwargs: Any) -> convert_module.ConvertResult:
        calls.append("plain")
        return real(*args, **kwargs)

    monkeypatch.setattr(convert_module, "_plain_copy", spy)
    plain = convert_module.convert(sources[source], f"plain.{target}", progress=False, **options)
    general = _recipe_path(sources[source], tmp_path / f"general.{target}", **options)
    assert calls == ["plain"]
    assert Path(plain.target).read_bytes() == Path(general.target).read_bytes()
    mine, theirs = dict(vars(plain)), dict(vars(general))
    assert Path(mine.pop("target")).name == "plain." + target
    assert Path(theirs.pop("target")).name == "general." + target
    assert mine == theirs


def test_options_that_need_a_recipe_take_the_recipe_path(sources: dict[str, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(convert_module, "_plain_copy", lambda *a, **k: pytest.fail("plain path taken"))
    result = convert_module.convert(sources["safetensors"], tmp_path / "o.bpk", progress=False,
                                    remaps=["^enc=encoder"])
    assert result.tensors == 4


def test_plain_copy_fails_like_the_recipe_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "f8.safetensors"
    save([from_numpy("scale", np.zeros(4, ml_dtypes.float8_e5m2))], src)
    errors = []
    for run in (lambda: convert_module.convert(src, "a.bpk", progress=False),
                lambda: _recipe_path(src, Path("b.bpk"))):
        with pytest.raises(MigratorError) as e:
            run()
        errors.append((type(e.value), e.value.detail.replace("b.bpk", "a.bpk")))
    assert errors[0] == errors[1] and "'scale'" in errors[0][1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f8.safetensors"]


def test_plain_convert_imports_no_pydantic(sources: dict[str, Path], tmp_path: Path) -> None:
    """The point of the plain path: a copy starts in a fraction of the recipe path's time."""
    code = ("import sys\nfrom migrator.cli import main\nrc = main(sys.argv[1:])\n"
            "assert rc == 0, rc\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pydantic', 'yaml', 'rich', 'numpy')))")
    out = subprocess.run([sys.executable, "-c", code, "convert", "--no-progress", str(sources["safetensors"]),
                          str(tmp_path / "o.bpk")], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.fixture
def sequential_pt(tmp_path: Path) -> Path:
    """nn.Sequential(Linear, ReLU, Linear): torch names the second Linear `2`, leaving a gap at 1."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    path = tmp_path / "seq.pt"
    torch.save(model.state_dict(), path)
    return path


def test_pytorch_convert_renumbers_by_default_like_a_recipe(sequential_pt: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.numpy import load_file

    monkeypatch.chdir(tmp_path)
    want = torch.load(sequential_pt, weights_only=True)
    # for Burn (a .bpk target) the default renumbers, as the recipe's default does
    result = convert_module.convert(sequential_pt, "plain.bpk", progress=False)
    general = _recipe_path(sequential_pt, tmp_path / "general.bpk")  # the recipe's default
    with open_file("plain.bpk") as r:
        assert sorted(r) == ["0.bias", "0.weight", "1.bias", "1.weight"]
        np.testing.assert_array_equal(r["1.weight"].numpy(), want["2.weight"].numpy())
    assert Path(result.target).read_bytes() == Path(general.target).read_bytes()
    # a SafeTensors target keeps the names torch loads, by both paths
    kept = convert_module.convert(sequential_pt, "kept.safetensors", progress=False)
    general = _recipe_path(sequential_pt, tmp_path / "general.safetensors")
    assert sorted(load_file(kept.target)) == sorted(want)
    assert Path(kept.target).read_bytes() == Path(general.target).read_bytes()
    renumbered = convert_module.convert(sequential_pt, "asked.safetensors", progress=False, contiguous_indices=True)
    assert sorted(load_file(renumbered.target)) == ["0.bias", "0.weight", "1.bias", "1.weight"]


def test_cli_no_contiguous_indices_keeps_the_names_and_emits_what_ran(sequential_pt: Path, tmp_path: Path) -> None:
    import yaml
    from safetensors.numpy import load_file

    from migrator.cli import main

    assert main(["convert", str(sequential_pt), str(tmp_path / "a.safetensors"), "--no-progress",
                 "--contiguous-indices"]) == 0
    assert "1.weight" in load_file(str(tmp_path / "a.safetensors"))
    assert main(["convert", str(sequential_pt), str(tmp_path / "b.safetensors"), "--no-progress",
                 "--no-contiguous-indices"]) == 0
    assert sorted(load_file(str(tmp_path / "b.safetensors"))) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    # for a .bpk the default renumbers, and the emitted recipe says so
    for flag, want in (([], True), (["--no-contiguous-indices"], False), (["--contiguous-indices"], True)):
        out = subprocess.run([sys.executable, "-m", "migrator.cli", "convert", str(sequential_pt),
                              str(tmp_path / "c.bpk"), "--emit-recipe", *flag], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert yaml.safe_load(out.stdout)["source"].get("contiguous_indices") == want


def test_non_pytorch_sources_keep_the_plain_path_and_their_names(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "gap.safetensors"
    save([from_numpy("seq.0.weight", np.zeros(2, np.float32)), from_numpy("seq.2.weight", np.ones(2, np.float32))],
         src)
    monkeypatch.setattr(convert_module, "build_recipe", lambda *a, **k: pytest.fail("recipe path taken"))
    result = convert_module.convert(src, tmp_path / "o.bpk", progress=False)
    from migrator import open_file

    with open_file(result.target) as r:
        assert sorted(t.name for t in r.tensors) == ["seq.0.weight", "seq.2.weight"]

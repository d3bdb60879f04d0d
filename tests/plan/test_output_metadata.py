"""SafeTensors outputs load in transformers: `format: pt` by default, explicit choices win."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from migrator import from_numpy, save
from migrator.cli import main
from migrator.core.scalars import Scalar

# transformers 4.x's `load_state_dict` raises OSError for a SafeTensors file whose metadata exists and
# whose `format` is not one of these; the installed transformers (5.x) no longer checks, so the test
# applies the 4.x rule itself next to the real loaders.
TRANSFORMERS_4_FORMATS = ("pt", "tf", "flax", "mlx")

W = np.arange(12, dtype=np.float32).reshape(3, 4)
B = np.linspace(-1, 1, 3, dtype=np.float32)


def _metadata(path: Path) -> dict[str, str] | None:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def _loads_like_transformers_4(path: Path) -> dict[str, torch.Tensor]:
    meta = _metadata(path)
    assert meta is None or meta.get("format") in TRANSFORMERS_4_FORMATS, meta
    from transformers.modeling_utils import load_state_dict

    state = load_state_dict(str(path))
    assert state.keys() == load_file(str(path)).keys()
    return state


@pytest.fixture
def burnpack(tmp_path: Path) -> Path:
    path = tmp_path / "model.bpk"
    save([from_numpy("fc.weight", W), from_numpy("fc.bias", B)], path,
         metadata={"format": "burnpack", "producer": "burn", "version": "0.22.0"},
         scalars={"epoch": Scalar("UInt", 3)})
    return path


def test_burnpack_to_safetensors_says_format_pt_and_loads_in_transformers(burnpack: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.safetensors"
    assert main(["convert", str(burnpack), str(out), "--no-progress"]) == 0
    assert _metadata(out)["format"] == "pt"  # type: ignore[index]
    state = _loads_like_transformers_4(out)
    assert torch.equal(state["fc.weight"], torch.from_numpy(W))
    assert torch.equal(state["fc.bias"], torch.from_numpy(B))


def test_recipe_run_to_safetensors_says_format_pt(burnpack: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {burnpack}}}\ntarget: {{path: {tmp_path / 'r.safetensors'}}}\n")
    assert main(["run", str(recipe), "--no-progress"]) == 0
    meta = _metadata(tmp_path / "r.safetensors")
    assert meta is not None and meta["format"] == "pt" and "migrator.recipe_sha256" in meta
    _loads_like_transformers_4(tmp_path / "r.safetensors")


def test_safetensors_source_without_format_gets_one_once_entries_are_added(tmp_path: Path) -> None:
    """The recipe's provenance keys alone would make metadata without `format`: refused by 4.x."""
    src = tmp_path / "plain.safetensors"
    save([from_numpy("fc.weight", W)], src)  # no metadata at all
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {src}}}\ntarget: {{path: {tmp_path / 'out.safetensors'}}}\n")
    assert main(["run", str(recipe), "--no-progress"]) == 0
    assert _metadata(tmp_path / "out.safetensors")["format"] == "pt"  # type: ignore[index]
    _loads_like_transformers_4(tmp_path / "out.safetensors")


def test_no_metadata_writes_none(burnpack: Path, tmp_path: Path) -> None:
    out = tmp_path / "bare.safetensors"
    assert main(["convert", str(burnpack), str(out), "--no-metadata", "--no-progress"]) == 0
    assert not _metadata(out)


def test_no_metadata_with_entries_adds_nothing(burnpack: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine.safetensors"
    assert main(["convert", str(burnpack), str(out), "--no-metadata", "--metadata", "note=x", "--no-progress"]) == 0
    assert _metadata(out) == {"note": "x"}


def test_explicit_format_wins(burnpack: Path, tmp_path: Path) -> None:
    out = tmp_path / "np.safetensors"
    assert main(["convert", str(burnpack), str(out), "--metadata", "format=np", "--no-progress"]) == 0
    assert _metadata(out)["format"] == "np"  # type: ignore[index]

"""Burn parity: the PyTorch layer fixtures migrated with `pytorch_to_burn` give the names, shapes and
values Burn's PytorchStore gives them (its layer fixtures), with module types inferred (no `modules:` map)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migrator import open_file
from migrator.plan.build import build_plan
from migrator.recipe.model import Recipe
from migrator.run.execute import run_plan
from tests.support.fixtures import fixture_file

torch = pytest.importorskip("torch")

T = "transpose"
# fixture -> (extra recipe fields, {torch name: (burn name, transform)})
PARITY: dict[str, tuple[dict[str, Any], dict[str, tuple[str, str | None]]]] = {
    "linear": ({}, {"fc1.weight": ("fc1.weight", T), "fc1.bias": ("fc1.bias", None),
                    "fc2.weight": ("fc2.weight", T)}),
    "linear_with_bias": ({}, {"fc1.weight": ("fc1.weight", T), "fc1.bias": ("fc1.bias", None)}),
    "conv1d": ({}, {n: (n, None) for n in ("conv1.weight", "conv1.bias", "conv2.weight")}),
    "conv2d": ({}, {n: (n, None) for n in ("conv1.weight", "conv1.bias", "conv2.weight")}),
    "conv_transpose1d": ({}, {n: (n, None) for n in ("conv1.weight", "conv1.bias", "conv2.weight")}),
    "conv_transpose2d": ({}, {n: (n, None) for n in ("conv1.weight", "conv1.bias", "conv2.weight")}),
    "embedding": ({}, {"embed.weight": ("embed.weight", None)}),
    "batch_norm2d": ({"filter": {"exclude": [{"regex": r"num_batches_tracked$"}]}},
                     {"norm1.weight": ("norm1.gamma", None), "norm1.bias": ("norm1.beta", None),
                      "norm1.running_mean": ("norm1.running_mean", None),
                      "norm1.running_var": ("norm1.running_var", None)}),
    "layer_norm": ({}, {"norm1.weight": ("norm1.gamma", None), "norm1.bias": ("norm1.beta", None)}),
    "group_norm": ({}, {"norm1.weight": ("norm1.gamma", None), "norm1.bias": ("norm1.beta", None)}),
    "key_remap": ({"remap": [{"from": r"conv\.(.*)", "to": "$1"}]},
                  {"conv.conv1.weight": ("conv1.weight", None), "conv.conv1.bias": ("conv1.bias", None),
                   "conv.conv2.weight": ("conv2.weight", None)}),
    "integer": ({}, {"buffer": ("buffer", None)}),
    "boolean": ({}, {"buffer": ("buffer", None)}),
    "buffer": ({}, {"buffer": ("buffer", None)}),
}


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _migrate(src: Path, tmp_path: Path, **extra: Any) -> Path:
    r = Recipe.model_validate({"version": 1, "source": {"path": str(src), **extra.pop("source", {})},
                               "adapters": ["pytorch_to_burn"], "target": {"path": str(tmp_path / "out.bpk")},
                               **extra})
    with build_plan(r, tmp_path) as plan:
        assert plan.ok, plan.fatal
        return Path(run_plan(plan, progress=False).target)


@pytest.mark.parametrize("name", sorted(PARITY))
def test_layer_fixture_matches_burn(name: str, tmp_path: Path) -> None:
    src = fixture_file("pytorch", f"{name}.pt")
    extra, expected = PARITY[name]
    out = _migrate(src, tmp_path, **extra)
    reference = _flatten(torch.load(src, weights_only=True))
    with open_file(out) as r:
        assert sorted(r.names()) == sorted(b for b, _ in expected.values())
        for torch_name, (burn_name, transform) in expected.items():
            want = reference[torch_name]
            if transform == T:
                want = want.t()
            got = r[burn_name].numpy()
            assert got.shape == tuple(want.shape), burn_name
            assert got.dtype == want.numpy().dtype, burn_name
            np.testing.assert_array_equal(got, want.contiguous().numpy(), err_msg=burn_name)


def test_top_level_key_fixture(tmp_path: Path) -> None:
    src = fixture_file("pytorch", "top_level_key.pt")
    out = _migrate(src, tmp_path, source={"top_level_key": "my_state_dict"})
    reference = torch.load(src, weights_only=True)["my_state_dict"]
    with open_file(out) as r:
        assert sorted(r.names()) == ["conv1.bias", "conv1.weight"]
        np.testing.assert_array_equal(r["conv1.weight"].numpy(), reference["conv1.weight"].numpy())


def test_unused_extras_reported_like_burn(tmp_path: Path) -> None:
    """batch_norm2d into a Burn-shaped template: num_batches_tracked stays unused, the load succeeds."""
    from migrator import from_numpy, save

    src = fixture_file("pytorch", "batch_norm2d.pt")
    template = tmp_path / "bn.bpk"
    save([from_numpy(f"norm1.{p}", np.zeros(5, np.float32), param_id=i)
          for i, p in enumerate(("gamma", "beta", "running_mean", "running_var"))], template)
    r = Recipe.model_validate({"version": 1, "source": {"path": str(src)}, "adapters": ["pytorch_to_burn"],
                               "target": {"path": str(tmp_path / "o.bpk"), "template": str(template)}})
    with build_plan(r, tmp_path) as plan:
        assert plan.ok, plan.fatal
        assert plan.report.applied == ["norm1.gamma", "norm1.beta", "norm1.running_mean", "norm1.running_var"]
        assert plan.report.unused == ["norm1.num_batches_tracked"]
        assert plan.report.missing == []

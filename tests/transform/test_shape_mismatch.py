"""Issue 20 item 4: a shape mismatch prints `[256, 32]`, the source and target names, once, and a hint.

The template is what Burn would hold: a Linear stored `[in, out]`; the source is a torch Linear's
state dict (`[out, in]`), written by torch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, save
from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")


def migrate(*args: str) -> tuple[int, str, str]:
    p = migrate_in_process(*args)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def files(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Linear(256, 32))
    torch.save({f"model.{k}": v for k, v in model.state_dict().items()}, tmp_path / "lin.pt")
    shapes = {"0.weight": (32, 256), "0.bias": (256,), "1.weight": (256, 32), "1.bias": (32,)}
    save([from_numpy(n, np.zeros(s, np.float32)) for n, s in shapes.items()], tmp_path / "tpl.bpk")
    return tmp_path


def run(files: Path, extra: str = "") -> tuple[int, str, str]:
    recipe = files / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: lin.pt}\nremap: [{from: '^model\\.', to: ''}]\n"
                      f"target: {{path: out.bpk, template: tpl.bpk}}\n{extra}")
    return migrate("run", str(recipe))


def test_plain_shapes_both_names_once_and_the_adapter_hint(files: Path) -> None:
    code, out, err = run(files)
    assert code == 1 and not (files / "out.bpk").exists()
    line = ("Shape mismatch for '0.weight': expected [32, 256], found [256, 32] in source tensor 'model.0.weight' "
            "(hint: the shape is transposed: add pytorch_to_burn to adapters: (burn_to_pytorch from a Burn file))")
    assert f"│  ⚠️  {line}" in out.splitlines()
    assert "dims" not in out + err
    assert (out + err).count("Shape mismatch for '0.weight'") == 1  # not again as an "error:" line


def test_hint_to_declare_a_linear_when_the_adapter_kept_it(files: Path) -> None:
    code, out, _ = run(files, "adapters: [pytorch_to_burn]\nmodules: {Other: ['^1$']}\n")
    assert code == 1
    assert ("Shape mismatch for '1.weight': expected [256, 32], found [32, 256] in source tensor 'model.1.weight' "
            "(hint: pytorch_to_burn transposes only Linear weights: declare it a Linear, "
            "modules: {Linear: ['^1$']})") in out
    assert "Shape mismatch for '0.weight'" not in out  # inferred Linear (bias of dim 0): transposed, fits


def test_a_conv1d_named_tensor_gets_the_conv1d_hint(tmp_path: Path) -> None:
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    sd = {f"h.0.attn.c_attn.{k}": v for k, v in Conv1D(24, 8).state_dict().items()}  # weight [8, 24]
    torch.save(sd, tmp_path / "c.pt")
    save([from_numpy("h.0.attn.c_attn.weight", np.zeros((24, 8), np.float32)),
          from_numpy("h.0.attn.c_attn.bias", np.zeros(24, np.float32))], tmp_path / "tpl.bpk")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: c.pt}\ntarget: {path: out.bpk, template: tpl.bpk}\n")
    code, out, _ = migrate("run", str(recipe))
    assert code == 1
    assert ("expected [24, 8], found [8, 24] in source tensor 'h.0.attn.c_attn.weight' (hint: GPT-2's Conv1D "
            "is stored [in, out], already Burn's Linear layout: declare "
            "modules: {Conv1D: ['^h\\.0\\.attn\\.c_attn$']} (kept as stored))") in out


def test_no_hint_for_other_mismatches(tmp_path: Path) -> None:
    save([from_numpy("w", np.zeros((3, 3), np.float32))], tmp_path / "s.safetensors")
    save([from_numpy("w", np.zeros((2, 2), np.float32))], tmp_path / "t.bpk")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: s.safetensors}\ntarget: {path: o.bpk, template: t.bpk}\n")
    code, out, _ = migrate("run", str(recipe))
    assert code == 1
    assert "│  ⚠️  Shape mismatch for 'w': expected [2, 2], found [3, 3] in source tensor 'w'" in out.splitlines()

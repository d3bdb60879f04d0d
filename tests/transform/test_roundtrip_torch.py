"""A real model through files: torch `.pt` -> burnpack (pytorch_to_burn) -> SafeTensors (burn_to_pytorch).

The state_dict must come back bit-identical and the torch forward output identical; with
half_precision, the stored values must equal torch's own `.half()` bit for bit."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migrator import open_file
from migrator.plan.build import build_plan
from migrator.recipe.model import Recipe
from migrator.run.execute import run_plan

torch = pytest.importorskip("torch")
nn = torch.nn
safetensors_torch = pytest.importorskip("safetensors.torch")

HIDDEN, HEADS, VOCAB = 32, 4, 100


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.output = nn.Linear(HIDDEN, HIDDEN)
        self.norm_1 = nn.LayerNorm(HIDDEN)
        self.linear_inner = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.linear_outer = nn.Linear(4 * HIDDEN, HIDDEN)
        self.norm_2 = nn.LayerNorm(HIDDEN)

    def forward(self, x: Any) -> Any:
        b, t, _ = x.shape
        d = HIDDEN // HEADS

        def heads(y: Any) -> Any:
            return y.view(b, t, HEADS, d).transpose(1, 2)

        att = (heads(self.query(x)) @ heads(self.key(x)).transpose(-1, -2)) / math.sqrt(d)
        y = (att.softmax(-1) @ heads(self.value(x))).transpose(1, 2).reshape(b, t, HIDDEN)
        x = self.norm_1(x + self.output(y))
        return self.norm_2(x + self.linear_outer(torch.nn.functional.gelu(self.linear_inner(x))))


class TinyBert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.position_embeddings = nn.Embedding(16, HIDDEN)
        self.layer_norm = nn.LayerNorm(HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.pooler = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, ids: Any) -> Any:
        x = self.word_embeddings(ids) + self.position_embeddings(torch.arange(ids.shape[1]))
        x = self.layer_norm(x)
        for layer in self.layers:
            x = layer(x)
        return torch.tanh(self.pooler(x[:, 0]))


MODULES = {"Linear": [r"\.(query|key|value|output|linear_inner|linear_outer)$", r"^pooler$"],
           "Embedding": [r"_embeddings$"], "LayerNorm": [r"norm(_\d)?$"]}


def _model() -> Any:
    torch.manual_seed(0)
    model = TinyBert().eval()
    with torch.no_grad():  # non-trivial norm parameters, so a gamma/beta mix-up would show
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model


def _run(tmp_path: Path, source: Path, target: Path, adapters: list[Any]) -> Any:
    r = Recipe.model_validate({"version": 1, "source": {"path": str(source)}, "modules": MODULES,
                               "adapters": adapters, "target": {"path": str(target)}})
    with build_plan(r, tmp_path) as plan:
        assert plan.ok, plan.fatal
        run_plan(plan, progress=False)
        return plan


def test_pt_to_burnpack_to_safetensors_is_bit_identical(tmp_path: Path) -> None:
    model = _model()
    pt = tmp_path / "bert.pt"
    torch.save(model.state_dict(), pt)
    plan = _run(tmp_path, pt, tmp_path / "bert.bpk", ["pytorch_to_burn"])
    sd = model.state_dict()
    with open_file(tmp_path / "bert.bpk") as bpk:
        np.testing.assert_array_equal(bpk["layers.0.query.weight"].numpy(), sd["layers.0.query.weight"].T.numpy())
        np.testing.assert_array_equal(bpk["layers.1.norm_2.gamma"].numpy(), sd["layers.1.norm_2.weight"].numpy())
        np.testing.assert_array_equal(bpk["word_embeddings.weight"].numpy(), sd["word_embeddings.weight"].numpy())
        assert "layers.0.norm_1.weight" not in bpk
    assert {e.module.how for e in plan.entries} == {"declared"}

    _run(tmp_path, tmp_path / "bert.bpk", tmp_path / "back.safetensors", ["burn_to_pytorch"])
    back = safetensors_torch.load_file(tmp_path / "back.safetensors")
    assert back.keys() == sd.keys()
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k].view(torch.uint8), v.view(torch.uint8)), k
    clone = TinyBert().eval()
    clone.load_state_dict(back)
    ids = torch.randint(0, VOCAB, (3, 16))
    with torch.no_grad():
        assert torch.equal(model(ids), clone(ids))


def test_half_precision_equals_torch_half(tmp_path: Path) -> None:
    model = _model()
    pt = tmp_path / "bert.pt"
    torch.save(model.state_dict(), pt)
    _run(tmp_path, pt, tmp_path / "half.bpk", ["pytorch_to_burn", "half_precision"])
    with open_file(tmp_path / "half.bpk") as bpk:
        assert {t.dtype.display for t in bpk.tensors} == {"F16"}
    # back to PyTorch layout, still F16: must equal torch's own .half() bit for bit
    _run(tmp_path, tmp_path / "half.bpk", tmp_path / "half.safetensors", ["burn_to_pytorch"])
    back = safetensors_torch.load_file(tmp_path / "half.safetensors")
    want = model.half().state_dict()
    for k, v in want.items():
        assert back[k].dtype == torch.float16 and torch.equal(back[k].view(torch.int16), v.view(torch.int16)), k
    # and half_precision on the way back restores F32 exactly from those F16 values
    _run(tmp_path, tmp_path / "half.bpk", tmp_path / "f32.safetensors", ["burn_to_pytorch", "half_precision"])
    f32 = safetensors_torch.load_file(tmp_path / "f32.safetensors")
    for k, v in want.items():
        assert f32[k].dtype == torch.float32 and torch.equal(f32[k], v.float()), k


def test_unresolvable_module_type_is_an_error_naming_the_tensor(tmp_path: Path) -> None:
    torch.save({"blk.mix.weight": torch.ones(4, 4)}, tmp_path / "m.pt")
    r = Recipe.model_validate({"version": 1, "source": {"path": str(tmp_path / "m.pt")},
                               "adapters": ["pytorch_to_burn"], "target": {"path": str(tmp_path / "o.bpk")}})
    with build_plan(r, tmp_path) as plan:
        assert not plan.ok
        [err] = plan.report.errors
        assert err.path == "blk.mix.weight" and err.kind == "adapter_error"
        assert "modules:" in err.message
    assert not (tmp_path / "o.bpk").exists()

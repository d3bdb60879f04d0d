"""The LoRA fold against PEFT 0.21.2's merge_and_unload on tiny seeded transformers models.

Each test saves a base model, wraps it with get_peft_model, fills lora_B (and the other trained
tensors) with seeded random values, saves the adapter, and compares migrator's folded folder with
PEFT's merged state dict: same keys, no lora_* left, values bit-equal in F32 (DoRA within 1e-6). The
tiny models' products are summed alike by most matmuls; the real-sized layers are where numpy's and
torch's orders part (tests/transform/test_lora_product.py checks the products themselves).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from migrator.core.errors import AdapterError  # noqa: E402
from migrator.files.io import open_file  # noqa: E402
from migrator.run.merge import fold_folder  # noqa: E402
from migrator.transform.merging.peft_adapter import fold_plan, open_adapter, pattern_key  # noqa: E402
from migrator.transform.merging.tensors import fold_tensors  # noqa: E402
from tests.support.models import tiny_gpt2, tiny_llama  # noqa: E402
from tests.support.torch_order import exact_or_close, torch_sums_in_order  # noqa: E402


@pytest.fixture(autouse=True)
def _small_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands of a few rows (the tiny weights would otherwise fit one band), so every test streams."""
    monkeypatch.setattr("migrator.ops.compute.bands.BAND_BYTES", 300)


def _randomize(model: Any, seed: int = 1) -> None:
    """Non-zero values in every trained adapter tensor (lora_B starts at zero, embedding A too)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name and "magnitude" not in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * 0.1)
            elif "lora_magnitude_vector" in name:
                p.mul_(1 + 0.1 * torch.rand(p.shape, generator=g).to(p.dtype))


def _oracle(tmp_path: Path, model: Any, config: Any, *, dtype: Any = None, shard: str | None = None,
            safe: bool = True) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """Save the base, make and save the adapter, merge with PEFT: (base dir, adapter dir, merged tensors)."""
    if dtype is not None:
        model = model.to(dtype)
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    model.save_pretrained(base, **({"max_shard_size": shard} if shard else {}))
    saved = set(open_file(base).keys())
    wrapped = peft.get_peft_model(model, config)
    _randomize(wrapped)
    wrapped.save_pretrained(adapter, safe_serialization=safe)
    merged = wrapped.merge_and_unload().state_dict()
    return base, adapter, {k: v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
                           for k, v in merged.items() if k in saved}


def _ours(tmp_path: Path, base: Path, adapter: Path, **kwargs: Any) -> dict[str, np.ndarray]:
    out = tmp_path / "out"
    fold_folder(base, adapter, out, **kwargs)
    with open_file(out) as r:
        return {k: (t.numpy().astype(np.float32) if t.dtype.name == "BF16" else t.numpy().copy()) for k, t in r.items()}


def _assert_equal(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], atol: float = 0.0) -> None:
    assert sorted(ours) == sorted(theirs)
    assert not any("lora_" in k for k in ours)
    for k in theirs:
        assert ours[k].shape == theirs[k].shape, k
        if atol == 0:  # bit-equal where this machine's torch sums as docs/merging.md says, else within rounding
            exact_or_close(ours[k], theirs[k], k)
        else:
            np.testing.assert_allclose(ours[k], theirs[k], rtol=0, atol=atol, err_msg=k)


def _changed(base: Path, merged: dict[str, np.ndarray]) -> set[str]:
    with open_file(base) as r:
        return {k for k, t in r.items() if not np.array_equal(t.numpy(), merged[k])}


LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("rslora", [False, True])
def test_linear_lora_bit_equal(tmp_path: Path, rslora: bool) -> None:
    config = peft.LoraConfig(r=8, lora_alpha=13, target_modules=LLAMA_TARGETS, use_rslora=rslora)
    base, adapter, theirs = _oracle(tmp_path, tiny_llama(), config)
    ours = _ours(tmp_path, base, adapter)
    _assert_equal(ours, theirs)
    assert len(_changed(base, theirs)) == 14  # 7 projections x 2 layers really changed


def test_merged_folder_loads_with_peft_logits(tmp_path: Path) -> None:
    import transformers

    config = peft.LoraConfig(r=8, lora_alpha=13, target_modules=LLAMA_TARGETS)
    model = tiny_llama()
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    model.save_pretrained(base)
    wrapped = peft.get_peft_model(model, config)
    _randomize(wrapped)
    wrapped.save_pretrained(adapter)
    reference = wrapped.merge_and_unload()
    fold_folder(base, adapter, tmp_path / "out")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.arange(12).reshape(1, 12)
    with torch.no_grad():
        np.testing.assert_allclose(loaded(ids).logits.numpy(), reference(ids).logits.numpy(), rtol=0, atol=1e-5)


def test_rank_and_alpha_patterns(tmp_path: Path) -> None:
    config = peft.LoraConfig(r=4, lora_alpha=7, target_modules=["q_proj", "v_proj", "down_proj"],
                             rank_pattern={"layers.0.self_attn.q_proj": 2, "down_proj": 6},
                             alpha_pattern={"v_proj": 3, "model.layers.1.mlp.down_proj": 5})
    base, adapter, theirs = _oracle(tmp_path, tiny_llama(), config)
    _assert_equal(_ours(tmp_path, base, adapter), theirs)
    with open_adapter(adapter) as a:
        assert a.config.rank_and_alpha("model.layers.0.self_attn.q_proj") == (2, 7)
        assert a.config.rank_and_alpha("model.layers.1.mlp.down_proj") == (6, 5)
    assert pattern_key({"q_proj": 1}, "model.layers.0.self_attn.q_proj") == "q_proj"
    assert pattern_key({"q_proj": 1}, "model.layers.0.self_attn.xq_proj") == "model.layers.0.self_attn.xq_proj"


def test_dora_within_1e6(tmp_path: Path) -> None:
    config = peft.LoraConfig(r=4, lora_alpha=7, target_modules=["q_proj", "v_proj", "up_proj"], use_dora=True)
    base, adapter, theirs = _oracle(tmp_path, tiny_llama(), config)
    _assert_equal(_ours(tmp_path, base, adapter), theirs, atol=1e-6)


def test_gpt2_fan_in_fan_out(tmp_path: Path) -> None:
    config = peft.LoraConfig(r=4, lora_alpha=7, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)
    base, adapter, theirs = _oracle(tmp_path, tiny_gpt2(), config)
    _assert_equal(_ours(tmp_path, base, adapter), theirs)
    assert any("c_attn" in k for k in _changed(base, theirs))


def test_gpt2_dora_fan_in_fan_out(tmp_path: Path) -> None:
    config = peft.LoraConfig(r=4, lora_alpha=7, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True,
                             use_dora=True)
    base, adapter, theirs = _oracle(tmp_path, tiny_gpt2(), config)
    _assert_equal(_ours(tmp_path, base, adapter), theirs, atol=1e-6)


@pytest.mark.parametrize("dora", [False, True])
def test_embedding_lora(tmp_path: Path, dora: bool) -> None:
    config = peft.LoraConfig(r=4, lora_alpha=7, target_modules=["embed_tokens", "q_proj"], use_dora=dora)
    base, adapter, theirs = _oracle(tmp_path, tiny_llama(), config)
    _assert_equal(_ours(tmp_path, base, adapter), theirs, atol=1e-6 if dora else 0.0)
    assert "model.embed_tokens.weight" in _changed(base, theirs)


def test_modules_to_save_replace_the_base(tmp_path: Path) -> None:
    config = peft.LoraConfig(r=4, lora_alpha=7, target_modules=["q_proj"], modules_to_save=["lm_head"])
    model = tiny_llama()
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    model.save_pretrained(base)
    wrapped = peft.get_peft_model(model, config)
    _randomize(wrapped)
    with torch.no_grad():  # the trained copy differs from the base's head
        wrapped.base_model.model.lm_head.modules_to_save["default"].weight.add_(1.0)
    wrapped.save_pretrained(adapter)
    theirs = {k: v.numpy() for k, v in wrapped.merge_and_unload().state_dict().items()}
    ours = _ours(tmp_path, base, adapter)
    _assert_equal(ours, {k: theirs[k] for k in ours})
    with open_file(base) as r:
        assert not np.array_equal(r["lm_head.weight"].numpy(), ours["lm_head.weight"])
    with open_file(base) as r, open_adapter(adapter) as a:
        assert fold_plan(r, a).replaced() == ["lm_head.weight"]


def test_bf16_base_rounds_once(tmp_path: Path) -> None:
    config = peft.LoraConfig(r=8, lora_alpha=13, target_modules=["q_proj", "down_proj"])
    model = tiny_llama()
    base, adapter, theirs = _oracle(tmp_path, model, config, dtype=torch.bfloat16)
    ours = _ours(tmp_path, base, adapter)
    # F32 arithmetic rounded once to BF16, computed by torch from the saved tensors
    with open_file(base) as r, open_adapter(adapter) as a:
        plan = fold_plan(r, a)
        for name in plan.folded():
            entry = plan.entries[name]
            w = torch.from_numpy(r[name].numpy().astype(np.float32))
            la = torch.from_numpy(entry.fold.lora_a.numpy().astype(np.float32))  # type: ignore[union-attr]
            lb = torch.from_numpy(entry.fold.lora_b.numpy().astype(np.float32))  # type: ignore[union-attr]
            once = (w + (lb @ la) * entry.fold.scaling).to(torch.bfloat16).float().numpy()  # type: ignore[union-attr]
            if torch_sums_in_order():
                assert np.array_equal(ours[name], once), name
            else:  # an ulp of the F32 delta can move the BF16 rounding by one BF16 ulp
                assert np.all(np.abs(ours[name] - once) <= np.spacing(np.abs(once)) * 2 ** 16), name
    for k in theirs:  # and PEFT's own merge within one BF16 ulp
        ulp = np.spacing(np.abs(theirs[k]).astype(np.float32)) * 2 ** 16
        assert np.all(np.abs(ours[k] - theirs[k]) <= ulp), k
    with open_file(tmp_path / "out") as r:
        assert {t.dtype.name for t in r.values()} == {"BF16"}


def test_sharded_base_and_bin_adapter(tmp_path: Path) -> None:
    config = peft.LoraConfig(r=4, lora_alpha=5, target_modules=["q_proj", "o_proj"])
    base, adapter, theirs = _oracle(tmp_path, tiny_llama(layers=3), config, shard="40KB", safe=False)
    assert (base / "model.safetensors.index.json").is_file()
    assert (adapter / "adapter_model.bin").is_file()
    ours = _ours(tmp_path, base, adapter, max_shard_size="60KB")
    _assert_equal(ours, theirs)
    out = tmp_path / "out"
    assert (out / "model.safetensors.index.json").is_file()
    for name in ("config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (base / name).read_bytes()


class _Convs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.point = torch.nn.Conv2d(6, 8, 1)
        self.wide = torch.nn.Conv2d(8, 5, 3)


@pytest.mark.parametrize("dora", [False, True])
def test_conv2d(tmp_path: Path, dora: bool) -> None:
    from migrator.files.io import save

    torch.manual_seed(0)
    model = _Convs()
    (tmp_path / "base").mkdir()
    save(model.state_dict(), tmp_path / "base" / "model.safetensors")
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=3, lora_alpha=7, target_modules=["point", "wide"],
                                                         use_dora=dora))
    _randomize(wrapped)
    wrapped.save_pretrained(tmp_path / "adapter")
    theirs = {k: v.numpy() for k, v in wrapped.merge_and_unload().state_dict().items()}
    ours = _ours(tmp_path, tmp_path / "base", tmp_path / "adapter")
    _assert_equal({k: ours[k] for k in ["point.weight"]}, {"point.weight": theirs["point.weight"]},
                  atol=1e-6 if dora else 0.0)
    _assert_equal(ours, theirs, atol=1e-6)  # the kxk delta is PEFT's conv, ours a matmul



class _RealSized(torch.nn.Module):
    """Layers of real widths: MKL's order for PEFT's B @ A there is an fma chain, where numpy's sgemm
    (OpenBLAS) sums differently; and a [16, 8] weight whose product torch sums without fma."""

    def __init__(self, conv1d: bool) -> None:
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        if conv1d:  # GPT-2's layout, W [in, out]
            self.big: torch.nn.Module = Conv1D(768, 256)
            self.small: torch.nn.Module = Conv1D(16, 8)
        else:
            self.big = torch.nn.Linear(1024, 512)
            self.square = torch.nn.Linear(256, 256)
            self.small = torch.nn.Linear(8, 16)
            self.emb = torch.nn.Embedding(1000, 256)


@pytest.mark.parametrize("conv1d", [False, True], ids=["linear+embedding", "conv1d"])
def test_real_sized_layers_bit_equal(tmp_path: Path, conv1d: bool) -> None:
    from migrator.files.io import save

    torch.manual_seed(0)
    model = _RealSized(conv1d)
    (tmp_path / "base").mkdir()
    save(model.state_dict(), tmp_path / "base" / "model.safetensors")
    targets = ["big", "small"] if conv1d else ["big", "square", "small", "emb"]
    config = peft.LoraConfig(r=8, lora_alpha=13, target_modules=targets, fan_in_fan_out=conv1d,
                             rank_pattern={"big": 16, "small": 2})
    wrapped = peft.get_peft_model(model, config)
    _randomize(wrapped)
    wrapped.save_pretrained(tmp_path / "adapter")
    theirs = {k: v.numpy() for k, v in wrapped.merge_and_unload().state_dict().items()}
    ours = _ours(tmp_path, tmp_path / "base", tmp_path / "adapter")
    _assert_equal(ours, theirs)
    assert _changed(tmp_path / "base", theirs) == {f"{t}.weight" for t in targets}

def _write_adapter(folder: Path, config: dict[str, Any], tensors: dict[str, np.ndarray]) -> Path:
    from migrator.files.io import save

    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save(tensors, folder / "adapter_model.safetensors")
    return folder


def _small_base(tmp_path: Path) -> Path:
    from migrator.files.io import save

    path = tmp_path / "base.safetensors"
    save({"a.proj.weight": np.ones((4, 3), np.float32), "a.norm": np.ones(4, np.float32)}, path)
    return path


LORA = {"peft_type": "LORA", "r": 2, "lora_alpha": 2, "bias": "none"}
AB = {"base_model.model.a.proj.lora_A.weight": np.ones((2, 3), np.float32),
      "base_model.model.a.proj.lora_B.weight": np.ones((4, 2), np.float32)}


def test_unmatched_adapter_tensor_is_an_error(tmp_path: Path) -> None:
    adapter = _write_adapter(tmp_path / "ad", LORA, {**AB, "base_model.model.b.proj.lora_A.weight": np.ones((2, 3),
                                                                                                         np.float32),
                                                     "base_model.model.b.proj.lora_B.weight": np.ones((4, 2),
                                                                                                      np.float32)})
    with pytest.raises(AdapterError, match=r"2 adapter tensor\(s\) match no base weight: .*b\.proj\.lora_A"):
        fold_folder(_small_base(tmp_path), adapter, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("change", "message"), [
    ({"peft_type": "IA3"}, "peft_type 'IA3' is not supported"),
    ({"bias": "all"}, "bias 'all' is not supported"),
    ({"layer_replication": [[0, 1]]}, "layer_replication"),
    ({"lora_bias": True}, "lora_bias"),
    ({"r": 0}, "r must be a positive integer"),
    ({"r": 3}, "the config gives r=3"),
    ({"use_dora": True}, "lora_magnitude_vector is missing"),
])
def test_refused_configs(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    adapter = _write_adapter(tmp_path / "ad", {**LORA, **change}, AB)
    with pytest.raises(AdapterError, match=message):
        fold_folder(_small_base(tmp_path), adapter, tmp_path / "out")


def test_shape_mismatch_names_the_tensors(tmp_path: Path) -> None:
    adapter = _write_adapter(tmp_path / "ad", LORA, {**AB, "base_model.model.a.proj.lora_B.weight":
                                                     np.ones((5, 2), np.float32)})
    with pytest.raises(AdapterError, match=r"a\.proj\.weight.*LoRA shapes do not fit.*lora_B\.weight' \[5, 2\]"):
        fold_folder(_small_base(tmp_path), adapter, tmp_path / "out")


def test_plan_reads_no_tensor_bytes(tmp_path: Path) -> None:
    adapter = _write_adapter(tmp_path / "ad", LORA, AB)
    with open_file(_small_base(tmp_path)) as r, open_adapter(adapter) as a:
        plan = fold_plan(r, a, lora_scale=0.5)
        out = fold_tensors(r, plan)
        assert plan.folded() == ["a.proj.weight"] and [t.name for t in out] == list(r.keys())
        # scaling = lora_scale * alpha / r; each delta element is 0.5 * (sum over r of 1 * 1) = 1
        folded = next(t for t in out if t.name == "a.proj.weight")
        assert np.array_equal(folded.numpy(), np.full((4, 3), 2.0, np.float32))


def test_adapting_and_replacing_one_weight_is_an_error(tmp_path: Path) -> None:
    adapter = _write_adapter(tmp_path / "ad", LORA, {**AB, "base_model.model.a.proj.weight": np.ones((4, 3),
                                                                                                     np.float32)})
    with pytest.raises(AdapterError, match=r"both adapts and replaces \(modules_to_save\) a\.proj\.weight"):
        fold_folder(_small_base(tmp_path), adapter, tmp_path / "out")

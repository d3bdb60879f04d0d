"""`migrate convert BASE OUT/ --lora ADAPTER` and `source: {path, lora}` recipes, end to end through the
CLI, against PEFT 0.21.2: the merged values of `merge_and_unload`, the logits of the folder loaded
with `from_pretrained`, the companion files of PEFT's merged `save_pretrained`; and the `sources:`
trap (a base and an adapter joined unmerged) refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from migrator.files.io import open_file  # noqa: E402
from tests.support.cli import migrate_in_process  # noqa: E402
from tests.support.models import tiny_llama  # noqa: E402
from tests.support.torch_order import exact_or_close, torch_sums_in_order  # noqa: E402

TARGETS = ["q_proj", "v_proj", "down_proj"]


def _base_and_adapter(tmp_path: Path, *, scale: float | None = None) -> tuple[Path, Path, Any]:
    """A saved tiny Llama (with its generation config), a saved adapter with random non-zero lora_B,
    and PEFT's merged model (each LoRA layer's scaling times `scale` first, as a merge with a scale)."""
    model = tiny_llama()
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    model.save_pretrained(base)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    wrapped.save_pretrained(adapter)
    if scale is not None:
        for module in wrapped.modules():
            if isinstance(module, peft.tuners.lora.LoraLayer):
                module.scale_layer(scale)
    return base, adapter, wrapped.merge_and_unload().eval()


def _tensors(path: Path) -> dict[str, np.ndarray]:
    with open_file(path) as r:
        return {k: t.numpy().copy() for k, t in r.items()}


def test_convert_lora_equals_peft_merge_and_loads(tmp_path: Path) -> None:
    base, adapter, merged = _base_and_adapter(tmp_path)
    out = tmp_path / "out"
    done = migrate_in_process("convert", str(base), f"{out}/", "--lora", str(adapter))
    assert done.returncode == 0, done.stderr
    assert "folded into 6 weights" in done.stdout
    ours = _tensors(out)
    theirs = merged.state_dict()
    assert sorted(ours) == sorted(theirs)
    for k, v in theirs.items():
        exact_or_close(ours[k], v.numpy(), k)
    # what PEFT's merged save_pretrained writes beside the weights: config and generation config
    merged.save_pretrained(tmp_path / "peft_out")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "peft_out").iterdir())
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.arange(10).reshape(1, 10)
    with torch.no_grad():
        np.testing.assert_allclose(loaded(ids).logits.numpy(), merged(ids).logits.numpy(), rtol=0, atol=1e-5)


def test_convert_lora_scale_and_dtype(tmp_path: Path) -> None:
    base, adapter, merged = _base_and_adapter(tmp_path, scale=0.5)
    out = tmp_path / "out"
    done = migrate_in_process("convert", str(base), f"{out}/", "--lora", str(adapter), "--lora-scale", "0.5",
                              "--dtype", "BF16", "--json")
    assert done.returncode == 0, done.stderr
    assert any("bfloat16" in n for n in json.loads(done.stdout)["notes"])
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with open_file(out) as r:
        assert {t.dtype.name for t in r.tensors} == {"BF16"}
        ours = {k: t.numpy().astype(np.float32) for k, t in r.items()}
    for k, v in merged.state_dict().items():  # F32 fold, rounded once: torch's own rounding of PEFT's F32
        want = v.to(torch.bfloat16).float().numpy()
        if torch_sums_in_order():
            assert np.array_equal(ours[k], want), k
        else:  # an ulp of the F32 delta can move the BF16 rounding by one BF16 ulp
            assert np.all(np.abs(ours[k] - want) <= np.spacing(np.abs(want)) * 2 ** 16), k


def test_recipe_source_lora_with_remap(tmp_path: Path) -> None:
    _, _, merged = _base_and_adapter(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: base, lora: {path: adapter}}\n"
                      "remap: [{from: '^model\\.', to: 'm.'}]\ntarget: {path: out.safetensors}\n")
    done = migrate_in_process("run", str(recipe), "--json")
    assert done.returncode == 0, done.stderr
    assert any("folded into 6 weights" in n for n in json.loads(done.stdout)["notes"])
    ours = _tensors(tmp_path / "out.safetensors")
    for k, v in merged.state_dict().items():
        exact_or_close(ours["m." + k[len("model."):] if k.startswith("model.") else k], v.numpy(), k)


def test_sources_base_plus_adapter_is_refused(tmp_path: Path) -> None:
    """The trap: the union of a base and its adapter would write lora_A/lora_B beside unmerged weights."""
    _base_and_adapter(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsources: [{path: base}, {path: adapter}]\ntarget: {path: out/}\n")
    done = migrate_in_process("run", str(recipe))
    assert done.returncode == 1
    assert "holds LoRA adapter tensors" in done.stderr and "lora: ADAPTER_FOLDER" in done.stderr
    assert not (tmp_path / "out").exists()
    # with lora: on the base's entry the same sources fold; a prefix keeps the tensors apart on purpose
    recipe.write_text("version: 1\nsources: [{path: base, lora: adapter}, {path: adapter, prefix: 'adapter.'}]\n"
                      "target: {path: out/}\n")
    done = migrate_in_process("run", str(recipe))
    assert done.returncode == 0, done.stderr
    names = set(_tensors(tmp_path / "out"))
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert any(n.startswith("adapter.") and "lora_A" in n for n in names)


def test_bad_lora_options(tmp_path: Path) -> None:
    base, _, _ = _base_and_adapter(tmp_path)
    done = migrate_in_process("convert", str(base), f"{tmp_path}/o1/", "--lora", str(base))
    assert done.returncode == 1 and "not a PEFT adapter folder" in done.stderr
    done = migrate_in_process("convert", str(base), f"{tmp_path}/o1/", "--lora", "someone/llama-lora")
    assert done.returncode == 1 and "hub id" in done.stderr and "huggingface-cli download" in done.stderr
    done = migrate_in_process("convert", str(base), f"{tmp_path}/o2/", "--lora-scale", "2")
    assert done.returncode == 2 and "--lora-scale" in done.stderr
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: base, lora: {path: adapter, scale: yes}}\ntarget: {path: o3/}\n")
    done = migrate_in_process("run", str(recipe))
    assert done.returncode == 2 and "r.yaml:2:" in done.stderr


def test_lora_fold_op_equals_peft(tmp_path: Path) -> None:
    """The `lora_fold` op over a base and an adapter kept apart by a prefix: PEFT's merged values."""
    _, _, merged = _base_and_adapter(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "version: 1\nsources: [{path: base}, {path: adapter/adapter_model.safetensors, prefix: 'ad.'}]\n"
        "ops:\n  - lora_fold:\n      from: ['(.*(q_proj|v_proj|down_proj))\\.weight',\n"
        "             'ad.base_model.model.$1.lora_A.weight', 'ad.base_model.model.$1.lora_B.weight']\n"
        "      scaling: 2.0\n"
        "target: {path: out.safetensors}\n")
    done = migrate_in_process("run", str(recipe))
    assert done.returncode == 0, done.stderr
    ours = _tensors(tmp_path / "out.safetensors")
    theirs = merged.state_dict()
    assert sorted(ours) == sorted(theirs)  # every lora_A/lora_B consumed by the folds
    for k, v in theirs.items():
        exact_or_close(ours[k], v.numpy(), k)


def test_the_adapter_is_protected_from_the_output(tmp_path: Path) -> None:
    """The adapter's weights are read by the run, as the base is: an output over them is refused (a fold
    and a merge's `base+lora`), and the adapter is left as it was."""
    base, adapter, _ = _base_and_adapter(tmp_path)
    before = {p.name: p.read_bytes() for p in adapter.iterdir()}
    done = migrate_in_process("convert", str(base), f"{adapter}/", "--lora", str(adapter), "--overwrite")
    assert done.returncode != 0 and "adapter_model.safetensors" in done.stderr, done.stderr
    config = tmp_path / "merge.yml"
    config.write_text("merge_method: linear\nmodels:\n  - {model: base+adapter, parameters: {weight: 1.0}}\n"
                      "  - {model: base, parameters: {weight: 1.0}}\n")
    done = migrate_in_process("merge", str(config), str(adapter), "--overwrite")
    assert done.returncode != 0 and "adapter_model.safetensors" in done.stderr, done.stderr
    weights = adapter / "adapter_model.safetensors"  # a one-file output over the adapter's weights, also nested
    done = migrate_in_process("convert", str(base), str(weights), "--lora", str(adapter), "--overwrite")
    assert done.returncode != 0 and "adapter_model.safetensors" in done.stderr, done.stderr
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsources: [{{path: base, lora: adapter}}]\n"
                      f"target: {{path: {weights}, overwrite: true}}\n")
    done = migrate_in_process("run", str(recipe))
    assert done.returncode != 0 and "adapter_model.safetensors" in done.stderr, done.stderr
    assert {p.name: p.read_bytes() for p in adapter.iterdir()} == before

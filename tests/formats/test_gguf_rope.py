"""Llama 3.1's RoPE scaling (`rope_type: llama3`) <-> GGUF: the per-dimension factors of
rope_freqs.weight against transformers' own llama3 inverse frequencies, the model read back by
transformers, and the folder made back from the GGUF (its config's rope_scaling exact, or refused
with the reason when the GGUF does not say)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
from tests.support.gguf_models import SCALING, tiny_llama31  # noqa: E402


@pytest.mark.parametrize("theta, dims, scaling", [
    (10000.0, 16, SCALING),
    (500000.0, 128, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}),  # Llama 3.1 8B's
    (500000.0, 64, {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}),  # Llama 3.2 1B's
    (10000.0, 32, {"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                   "original_max_position_embeddings": 256}),
])
def test_factors_are_transformers_llama3_frequencies(theta: float, dims: int, scaling: dict[str, float]) -> None:
    """default inv_freq / llama3 inv_freq (transformers' ROPE_INIT_FUNCTIONS) = our factor per pair."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from migrator.formats.gguf.llama import llama3_rope_factors

    cfg = transformers.LlamaConfig(hidden_size=dims * 4, num_attention_heads=4, rope_theta=theta,
                                   rope_scaling={"rope_type": "llama3", **scaling})
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    default = 1.0 / (theta ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))
    ours = llama3_rope_factors(scaling, theta, dims)
    assert ours.dtype == np.float32 and ours.shape == (dims // 2,)
    np.testing.assert_allclose(ours, (default / scaled).numpy(), rtol=2e-6)
    assert ours.min() == 1.0 and ours.max() == scaling["factor"]  # both bands present: the test can tell them apart


@pytest.fixture(scope="module")
def llama31(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("rope") / "hf"
    tiny_llama31().save_pretrained(folder)
    out = folder.parent / "m.gguf"
    res = migrate_in_process("convert", str(folder), str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "RoPE factors computed from target.rope_scaling" in res.stdout + res.stderr
    return folder, out


def test_hf_to_gguf_writes_rope_freqs(llama31: tuple[Path, Path], tmp_path: Path) -> None:
    from migrator.formats.gguf.llama import llama3_rope_factors

    folder, out = llama31
    r = gguf.GGUFReader(str(out))
    freqs = next(t for t in r.tensors if t.name == "rope_freqs.weight")
    assert freqs.tensor_type == gguf.GGMLQuantizationType.F32
    assert np.array_equal(np.asarray(freqs.data), llama3_rope_factors(SCALING, 10000.0, 16))
    assert r.fields["llama.context_length"].contents() == 128
    assert "llama.rope.scaling.type" not in r.fields  # llama.cpp reads the factors alone (a type would add to them)
    # transformers reads the weights back equal (it leaves rope_freqs aside)
    original = transformers.LlamaForCausalLM.from_pretrained(folder)
    back = transformers.LlamaForCausalLM.from_pretrained(out.parent, gguf_file=out.name)
    a, b = original.state_dict(), back.state_dict()
    assert set(a) == set(b) and [k for k in a if not torch.equal(a[k], b[k])] == []


def test_gguf_to_hf_keeps_rope_scaling(llama31: tuple[Path, Path], tmp_path: Path) -> None:
    folder, out = llama31
    res = migrate_in_process("convert", str(out), str(tmp_path / "back") + "/")
    assert res.returncode == 0, res.stdout + res.stderr
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "back")
    original = transformers.LlamaForCausalLM.from_pretrained(folder)
    assert back.config.rope_parameters["rope_type"] == "llama3"
    assert {k: back.config.rope_parameters[k] for k in SCALING} == SCALING
    tokens = torch.tensor([[1, 5, 17, 42, 7, 9, 33, 60]])
    assert torch.equal(back(tokens).logits, original(tokens).logits)
    plain = tiny_llama31(scaling=None)  # the same weights without scaling: other logits, so the check can fail
    assert not torch.allclose(plain(tokens).logits, original(tokens).logits, atol=1e-3)


def _without_settings(out: Path, tmp_path: Path) -> Path:
    """The GGUF as llama.cpp's converter writes it: rope_freqs.weight, no migrator.rope_scaling."""
    stripped = tmp_path / "llamacpp-style.gguf"
    r = gguf.GGUFReader(str(out))
    writer = gguf.GGUFWriter(str(stripped), "llama")
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "migrator.rope_scaling"):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(field.name, field.contents(), field.types[0])
    for t in r.tensors:
        writer.add_tensor(t.name, np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stripped


def test_rope_freqs_without_settings_is_refused_then_given(llama31: tuple[Path, Path], tmp_path: Path) -> None:
    folder, out = llama31
    stripped = _without_settings(out, tmp_path)
    res = migrate_in_process("convert", str(stripped), str(tmp_path / "back") + "/")
    assert res.returncode != 0
    assert "rope_freqs.weight" in res.stderr + res.stdout and "original_max_position_embeddings" in res.stderr + \
        res.stdout
    assert not (tmp_path / "back").exists()

    def run(scaling: dict[str, object], name: str) -> Any:
        """`migrate run` of the convert's recipe, with target.rope_scaling giving the settings."""
        import yaml

        from migrator.recipe.convert import build_recipe, emit_recipe

        recipe = tmp_path / f"{name}.yaml"
        data = yaml.safe_load(emit_recipe(build_recipe(stripped, str(tmp_path / name) + "/"), recipe))
        data["target"]["rope_scaling"] = scaling
        recipe.write_text(yaml.safe_dump(data))
        return migrate_in_process("run", str(recipe))

    res = run({**SCALING, "original_max_position_embeddings": 64}, "wrong")
    assert res.returncode != 0 and "does not give the GGUF's rope_freqs.weight" in res.stdout + res.stderr
    res = run(SCALING, "given")
    assert res.returncode == 0, res.stdout + res.stderr
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "given")
    original = transformers.LlamaForCausalLM.from_pretrained(folder)
    tokens = torch.tensor([[1, 5, 17, 42, 7, 9, 33, 60]])
    assert torch.equal(back(tokens).logits, original(tokens).logits)


def test_other_rope_scaling_is_refused(tmp_path: Path) -> None:
    tiny_llama31(scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}).save_pretrained(
        tmp_path / "hf")
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(tmp_path / "m.gguf"))
    assert res.returncode != 0 and "RoPE scaling 'yarn' is not converted to GGUF" in res.stdout + res.stderr


def test_rope_scaling_needs_a_gguf_target_or_hf_config(tmp_path: Path) -> None:
    from migrator.plan.build import build_plan
    from migrator.recipe.convert import build_recipe
    from migrator.recipe.model import RopeScalingSpec

    tiny_llama31(scaling=None).save_pretrained(tmp_path / "hf")
    recipe = build_recipe(tmp_path / "hf", tmp_path / "out.safetensors")
    recipe = recipe.model_copy(update={"target": recipe.target.model_copy(
        update={"rope_scaling": RopeScalingSpec(**SCALING)})})
    with build_plan(recipe, tmp_path) as plan:
        assert any("rope_scaling apply to GGUF targets" in f for f in plan.fatal), plan.fatal

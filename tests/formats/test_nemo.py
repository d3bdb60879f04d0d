"""NeMo 2 checkpoint folders (`weights/` + `context/`) read without NeMo, megatron or fiddle (`formats/nemo/`).

The oracle is megatron-core 0.16.1 (`tests/support/nemo.py`): it writes the tensors NeMo saves (the
model's `sharded_state_dict(prefix="module.")`) on 2 gloo ranks and reads them back with
`load_plain_tensors`; the context is written as NeMo's serializer lays it out, from the configuration
that built the model. Every per-layer tensor migrator lists must equal megatron's, bit for bit, and
`${config.KEY}` must give the values the model was built with, under Megatron-LM's names.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.hostile import refused
from tests.support.nemo import cached_nemo_checkpoint
from tests.support.torch_dist import FFN, GROUPS, HEADS, HIDDEN, LAYERS, PADDED, SEQ

torch = pytest.importorskip("torch")
slow = pytest.mark.slow  # megatron-core writing on 2 ranks: ~15-50 s, once per session

from migrator.files.io import open_file  # noqa: E402


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    pytest.importorskip("megatron.core")
    return cached_nemo_checkpoint(tmp_path_factory)


@pytest.fixture
def copy(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> Path:
    """A copy of the NeMo folder, to spoil."""
    shutil.copytree(written[0], tmp_path / "nemo")
    return tmp_path / "nemo"


@slow
def test_every_tensor_equals_megatrons_own_reading(written: tuple[Path, dict[str, Any]]) -> None:
    folder, oracle = written
    plain = oracle["plain"]
    assert any(k.startswith("module.decoder.layers.") for k in plain)  # NeMo's prefix is what is saved
    optimizer = {k for k in plain if k.startswith("optimizer.state.")}
    assert len(optimizer) == 18  # exp_avg and exp_avg_sq of the 9 saved parameters, as NeMo saves them by default
    with open_file(folder) as r:
        assert r.format == "nemo"
        seen = set()
        for name in r.names():
            assert not name.startswith("module.")
            parts = name.split(".")
            if name.startswith("decoder.layers."):
                key = "module.decoder.layers." + ".".join(parts[3:])
                expected = plain[key][int(parts[2])]
            else:
                key = "module." + name
                expected = plain[key]
            seen.add(key)
            assert torch.equal(torch.from_numpy(r[name].numpy().copy()), expected), name
        assert seen == {k for k in plain if not k.endswith("_extra_state")} - optimizer
        assert r["embedding.word_embeddings.weight"].shape == (PADDED, HIDDEN)  # NeMo's vocab_size: rows as saved
        notes = " | ".join(r.notes)
        assert "read without the 'module.' prefix" in notes and "agrees with context/io.json" in notes
        assert "18 tensors outside the model (not under 'module.': optimizer.state." in notes  # said, not silent
        assert r.extra()["nemo"]["config_class"] == "nemo.collections.llm.gpt.model.llama.Llama3Config"


@slow
def test_weights_alone_is_read_as_saved(written: tuple[Path, dict[str, Any]]) -> None:
    """weights/ named alone is the torch_dist checkpoint under its saved names, the optimizer's state
    included (its moments equal megatron's reading), with a note naming the NeMo folder."""
    folder, oracle = written
    plain = oracle["plain"]
    with open_file(folder / "weights") as r:
        assert r.format == "torch_dist"
        name = "optimizer.state.module.decoder.layers.1.mlp.linear_fc2.weight.exp_avg_sq"  # per parameter, per layer
        expected = plain["optimizer.state.exp_avg_sq.module.decoder.layers.mlp.linear_fc2.weight"][1]
        assert torch.equal(torch.from_numpy(r[name].numpy().copy()), expected) and expected.abs().sum() > 0
        assert "module.embedding.word_embeddings.weight" in r
        assert any(f"name the checkpoint folder ({folder})" in n for n in r.notes)


@slow
def test_config_is_the_models_in_megatron_lms_names(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """`${config.KEY}` in a recipe: NeMo's names mapped (layernorm_epsilon -> norm_epsilon, seq_length ->
    max_position_embeddings, share_embeddings_and_output_weights -> untie_..., gated silu -> swiglu)."""
    folder, _ = written
    keys = {"num_layers": LAYERS, "hidden_size": HIDDEN, "ffn_hidden_size": FFN, "num_attention_heads": HEADS,
            "num_query_groups": GROUPS, "kv_channels": HIDDEN // HEADS, "max_position_embeddings": SEQ,
            "padded_vocab_size": PADDED, "norm_epsilon": 1e-5, "untie_embeddings_and_output_weights": True,
            "swiglu": True, "params_dtype": "float32", "group_query_attention": True}
    from migrator.files.model_config import find_config, load_config
    from migrator.recipe.config import evaluate

    where = find_config(None, folder, tmp_path)
    assert where == folder / "context" / "model.yaml"
    config = load_config(where)
    assert {k: evaluate(f"${{config.{k}}}", config, where) for k in keys} == keys
    assert "vocab_size" not in config  # Megatron-LM's vocab_size is the tokenizer's, which NeMo does not record


@slow
def test_inspect_and_convert(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    folder, oracle = written
    done = migrate_in_process("inspect", str(folder))
    assert done.returncode == 0, done.stderr
    assert "decoder.layers.1.mlp.linear_fc1.weight" in done.stdout and "module." not in done.stdout.split("note:")[0]
    done = migrate_in_process("convert", str(folder), str(tmp_path / "m.safetensors"))
    assert done.returncode == 0, done.stderr
    from safetensors.torch import load_file

    flat = load_file(tmp_path / "m.safetensors")
    assert torch.equal(flat["decoder.layers.0.self_attention.linear_qkv.weight"],
                       oracle["plain"]["module.decoder.layers.self_attention.linear_qkv.weight"][0])


# -- bad input: one line, exit 1, nothing written ------------------------------------------------------------

def _yaml(copy: Path) -> Path:
    return copy / "context" / "model.yaml"


@slow
def test_model_yaml_contradicting_the_weights_is_refused(copy: Path, tmp_path: Path) -> None:
    text = _yaml(copy).read_text()
    _yaml(copy).write_text(text.replace(f"  num_layers: {LAYERS}\n", f"  num_layers: {LAYERS + 1}\n"))
    (copy / "context" / "io.json").unlink()  # else io.json's num_layers disagrees first
    done = refused(["convert", str(copy), str(tmp_path / "o.safetensors")], tmp_path,
                   words=f"context/model.yaml says num_layers {LAYERS + 1}")
    assert done.returncode == 1


@slow
def test_model_yaml_contradicting_io_json_is_refused(copy: Path, tmp_path: Path) -> None:
    text = _yaml(copy).read_text()
    _yaml(copy).write_text(text.replace(f"  hidden_size: {HIDDEN}\n", f"  hidden_size: {HIDDEN * 2}\n"))
    done = refused(["inspect", str(copy)], tmp_path, words="model.yaml")
    assert "io.json says 64" in done.stderr and "hidden_size" in done.stderr and done.returncode == 1


@slow
def test_missing_weights_is_refused(copy: Path, tmp_path: Path) -> None:
    shutil.rmtree(copy / "weights")
    done = refused(["convert", str(copy), str(tmp_path / "o.safetensors")], tmp_path, words="weights")
    assert "without its weights/ folder" in done.stderr and done.returncode == 1


@slow
@pytest.mark.parametrize(("text", "said"), [
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)), "expands to more than"),
    ("config: !!python/object/apply:os.system [echo hi]\n", "not YAML"),
    ("config: &c {x: *c}\n", "recursive YAML"),
    ("config: {num_layers: " + "9" * 5000 + "}\n", "more than 400 characters"),
    ("- just\n- a list\n", "not a mapping"),
    ("_target_: x\n", "no config: mapping"),
    ("config: {num_layers: two}\n", "config.num_layers is 'two', not a count"),
])
def test_hostile_model_yaml_is_refused(copy: Path, tmp_path: Path, text: str, said: str) -> None:
    _yaml(copy).write_text(text)
    done = refused(["inspect", str(copy)], tmp_path, words="model.yaml")
    assert said in done.stderr and done.returncode == 1


@slow
def test_a_huge_model_yaml_is_refused_unread(copy: Path, tmp_path: Path) -> None:
    with open(_yaml(copy), "ab") as f:
        f.truncate(17 * 2**20)  # past the 16 MiB a model.yaml may have: refused before parsing
    done = refused(["inspect", str(copy)], tmp_path, words="model.yaml")
    assert done.returncode == 1


@slow
def test_hostile_io_json_is_refused(copy: Path, tmp_path: Path) -> None:
    (copy / "context" / "io.json").write_text("[" * 100_000)
    done = refused(["inspect", str(copy)], tmp_path, words="io.json")
    assert done.returncode == 1


@slow
def test_llama31_rope_scaling_is_refused_by_hf_config(copy: Path, tmp_path: Path) -> None:
    """NeMo's Llama31Config (`scale_factor`) scales RoPE: the made config.json could not say so."""
    text = _yaml(copy).read_text()
    _yaml(copy).write_text(text.replace("config:\n", "config:\n  scale_factor: 8.0\n", 1))
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "megatron-llama-to-hf.yaml"
    done = migrate_in_process("run", str(recipe), "--source", str(copy), "--target", f"{tmp_path / 'hf'}/",
                              "--no-progress")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "use_rope_scaling" in done.stderr.splitlines()[0] and not (tmp_path / "hf").exists()


@slow
def test_io_json_alone_gives_no_configuration(copy: Path, tmp_path: Path) -> None:
    """io.json records only the arguments given: without model.yaml the folder is read without a
    configuration, said in a note, and a recipe's `${config.KEY}` or hf_config is refused."""
    _yaml(copy).unlink()
    with open_file(copy) as r:
        assert r.format == "nemo" and "decoder.layers.0.mlp.linear_fc1.weight" in r
        assert any("has no model.yaml" in n for n in r.notes)
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "megatron-llama-to-hf.yaml"
    done = migrate_in_process("run", str(recipe), "--source", str(copy), "--target", f"{tmp_path / 'hf'}/",
                              "--no-progress")  # exit 2: the recipe's references cannot be resolved, one line each
    assert done.returncode == 2 and "Traceback" not in done.stderr and not (tmp_path / "hf").exists()
    assert "model.yaml does not exist (a NeMo 2 checkpoint's io.json alone" in done.stderr


def test_nemo_names_are_mapped_for_each_family() -> None:
    """The configurations NeMo's Mixtral / Qwen / Llama 3.1 classes dump, in Megatron-LM's names (no
    weights needed: `megatron_args` on model.yaml's config as `tests/support/nemo.py` writes it)."""
    pytest.importorskip("megatron.core")
    from migrator.formats.nemo.config import _value, megatron_args
    from tests.support.nemo import model_yaml

    def args(**given: Any) -> dict[str, Any]:
        config = model_yaml({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, **given})["config"]
        config.update({k: v for k, v in given.items() if k not in config})  # a subclass's own field (scale_factor)
        return megatron_args({k: _value(v) for k, v in config.items()})

    moe = args(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=32, gated_linear_unit=True,
               activation_func=torch.nn.functional.silu, params_dtype=torch.bfloat16, bf16=True)
    assert (moe["num_experts"], moe["moe_router_topk"], moe["moe_ffn_hidden_size"], moe["swiglu"],
            moe["params_dtype"]) == (8, 2, 32, True, "bfloat16")
    assert args(add_qkv_bias=True)["add_qkv_bias"] is True and args(qk_layernorm=True)["qk_layernorm"] is True
    assert args(num_query_groups=None)["group_query_attention"] is False
    assert args(gated_linear_unit=True, activation_func=torch.nn.functional.gelu)["swiglu"] is False
    assert args(scale_factor=8.0)["use_rope_scaling"] is True and args()["use_rope_scaling"] is False
    assert args()["untie_embeddings_and_output_weights"] is False  # GPTConfig shares them by default


@slow
def test_hf_config_without_model_yaml_is_refused(copy: Path, tmp_path: Path) -> None:
    _yaml(copy).unlink()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {copy}}}\ntarget: {{path: {tmp_path / 'hf'}/, hf_config: true}}\n")
    done = migrate_in_process("run", str(recipe), "--no-progress")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "context has no model.yaml to make a config.json from" in done.stderr.splitlines()[0]

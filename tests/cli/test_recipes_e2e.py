"""The checked-in recipes run end to end on generated data, through the `migrate` command line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from migrator import open_file
from migrator.cli import main
from migrator.recipe.loader import load_recipe
from tests.support.cli import migrate_subprocess
from tests.support.recipes import ORDER, WITHOUT_DEMO

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """recipes/ copied beside a freshly generated demo-out/, as `make demo` lays them out."""
    shutil.copytree(REPO / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    subprocess.run([sys.executable, str(REPO / "recipes" / "generate_demo_data.py"), str(tmp_path / "demo-out")],
                   check=True, capture_output=True)
    return tmp_path


def test_every_recipe_is_exercised() -> None:
    shipped = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))
    assert sorted(ORDER + [n for n in WITHOUT_DEMO if n in shipped]) == shipped


def test_all_recipes_run_and_round_trip(workspace: Path) -> None:
    out = workspace / "demo-out"
    for name in ORDER:
        assert main(["run", str(workspace / "recipes" / f"{name}.yaml"), "--no-progress"]) == 0, name
    # a model folder re-sharded: the same tensors (safetensors' own reader), config.json copied
    from safetensors.numpy import load_file

    resharded: dict[str, np.ndarray] = {}
    for shard in sorted((out / "tiny-bert-resharded").glob("model-*.safetensors")):
        resharded.update(load_file(str(shard)))
    original = load_file(str(out / "tiny-bert.safetensors"))
    assert sorted(resharded) == sorted(original) and all(np.array_equal(resharded[k], original[k]) for k in original)
    config = (out / "tiny-bert-resharded" / "config.json").read_bytes()
    assert config == (out / "tiny-bert-hf" / "config.json").read_bytes()
    # MLP: index gaps closed, Linear weights transposed to Burn's [in, out]
    with open_file(out / "mlp.pt") as pt, open_file(out / "mlp.bpk") as bpk:
        assert bpk.names() == [f"layers.{i}.{p}" for i in range(3) for p in ("weight", "bias")]
        np.testing.assert_array_equal(bpk["layers.2.weight"].numpy(), pt["model.net.4.weight"].numpy().T)
        assert bpk.metadata["migrator.recipe_sha256"] == load_recipe(workspace / "recipes/mlp-to-burn.yaml").sha256
    with open_file(out / "mlp.pt") as pt, open_file(out / "mlp-f16.safetensors") as f16:
        got = f16["model.net.0.weight".replace("model.net.", "layers.")].numpy()
        np.testing.assert_array_equal(got, pt["model.net.0.weight"].numpy().astype(np.float16))
        assert f16.metadata["format"] == "pt"
    # encoder surgery: template order and param_ids, head kept, attention transposed
    with open_file(out / "classifier-init.bpk") as init, open_file(out / "classifier.bpk") as cls, \
            open_file(out / "tiny-bert.safetensors") as bert:
        assert cls.names() == init.names()
        assert [t.param_id for t in cls.tensors] == [t.param_id for t in init.tensors]
        assert bytes(cls["classifier.weight"].data()) == bytes(init["classifier.weight"].data())
        np.testing.assert_array_equal(cls["encoder.layers.1.mha.value.weight"].numpy(),
                                      bert["encoder.layer.1.attention.self.value.weight"].numpy().T)
    # BERT -> Burn -> BERT is bit-identical (position_ids is a buffer the Burn model does not have)
    with open_file(out / "tiny-bert.safetensors") as a, open_file(out / "tiny-bert-roundtrip.safetensors") as b:
        assert sorted(b.names()) == sorted(n for n in a.names() if n != "embeddings.position_ids")
        for t in b.tensors:
            assert bytes(t.data()) == bytes(a[t.name].data()), t.name
    with open_file(out / "tiny-bert.bpk") as bpk:
        assert "encoder.layers.0.norm_1.gamma" in bpk and "embeddings.layer_norm.beta" in bpk
    # several sources: the donor's encoder under bert., the other donor's head, the template's embeddings
    with open_file(out / "bert-grafted.safetensors") as g, open_file(out / "bert-encoder-donor.safetensors") as enc, \
            open_file(out / "bert-head-donor.safetensors") as head, \
            open_file(out / "bert-cls-init.safetensors") as init:
        assert g.names() == init.names()
        for t in g.tensors:
            donor = enc[t.name[5:]] if t.name.startswith("bert.encoder.") else \
                head[t.name] if t.name.startswith("classifier.") else init[t.name]
            assert bytes(t.data()) == bytes(donor.data()), t.name
    # index arithmetic: layers 12-23 renumbered 0-11; two 6-layer models stacked into 12 layers
    with open_file(out / "bert-12-layers-top.safetensors") as cut, open_file(out / "bert-24-layers.safetensors") as big:
        assert len(cut.names()) == len(big.names()) - 12 * 16
        np.testing.assert_array_equal(cut["encoder.layer.0.output.dense.weight"].numpy(),
                                      big["encoder.layer.12.output.dense.weight"].numpy())
        np.testing.assert_array_equal(cut["embeddings.word_embeddings.weight"].numpy(),
                                      big["embeddings.word_embeddings.weight"].numpy())
    with open_file(out / "bert-12-layers-stacked.safetensors") as st, \
            open_file(out / "bert-6-layers-a.safetensors") as lo, open_file(out / "bert-6-layers-b.safetensors") as hi:
        for i in range(12):
            name = f"encoder.layer.{i}.attention.self.query.weight"
            want = lo[name] if i < 6 else hi[f"encoder.layer.{i - 6}.attention.self.query.weight"]
            np.testing.assert_array_equal(st[name].numpy(), want.numpy())
    # the merge recipes: a LoRA fold (W + alpha / r B @ A), a depth up-scaling (layers 0-2 then 1-3)
    from safetensors.numpy import load_file as load_st

    base = load_st(str(out / "llama-base" / "model.safetensors"))
    adapter = load_st(str(out / "llama-lora" / "adapter_model.safetensors"))
    folded = load_st(str(out / "llama-lora-merged" / "model.safetensors"))
    p = "model.layers.2.self_attn.v_proj"
    a, b = adapter[f"base_model.model.{p}.lora_A.weight"], adapter[f"base_model.model.{p}.lora_B.weight"]
    np.testing.assert_allclose(folded[p + ".weight"], base[p + ".weight"] + (b @ a) * np.float32(2), rtol=0, atol=1e-7)
    assert np.array_equal(folded["model.layers.2.mlp.up_proj.weight"], base["model.layers.2.mlp.up_proj.weight"])
    upscaled = load_st(str(out / "llama-upscaled" / "model.safetensors"))
    assert np.array_equal(upscaled["model.layers.3.mlp.down_proj.weight"], base["model.layers.1.mlp.down_proj.weight"])
    assert json.loads((out / "llama-upscaled" / "config.json").read_text())["num_hidden_layers"] == 6
    for merged in ("llama-slerp", "llama-ties"):
        assert sorted(load_st(str(out / merged / "model.safetensors"))) == sorted(base)
    # experts 0 and 2 of 4 kept: renumbered 0 and 1, the routers' rows gathered, the config saying 2
    mixtral = load_st(str(out / "mixtral-tiny-hf" / "model.safetensors"))
    pruned = load_st(str(out / "mixtral-tiny-pruned" / "model.safetensors"))
    assert len(pruned) == len(mixtral) - 2 * 2 * 3
    for layer in range(2):
        p = f"model.layers.{layer}.block_sparse_moe."
        assert np.array_equal(pruned[p + "gate.weight"], mixtral[p + "gate.weight"][[0, 2]])
        for new, old in ((0, 0), (1, 2)):
            for w in ("w1", "w2", "w3"):
                assert np.array_equal(pruned[f"{p}experts.{new}.{w}.weight"], mixtral[f"{p}experts.{old}.{w}.weight"])
    assert json.loads((out / "mixtral-tiny-pruned" / "config.json").read_text())["num_local_experts"] == 2
    # three tokens added: the tokenizer's next ids, the rows the mean of the old ones (numpy's mean), vocab_size
    vocab = load_st(str(out / "llama-vocab" / "model.safetensors"))
    grown = load_st(str(out / "llama-vocab-grown" / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        old = vocab[name]
        assert grown[name].shape == (old.shape[0] + 3, old.shape[1])
        assert np.array_equal(grown[name][:old.shape[0]], old)
        np.testing.assert_allclose(grown[name][old.shape[0]:], np.broadcast_to(old.mean(axis=0), (3, old.shape[1])),
                                   rtol=0, atol=1e-7)
    added = json.loads((out / "llama-vocab-grown" / "tokenizer.json").read_text())["added_tokens"][-3:]
    assert [(a["id"], a["content"]) for a in added] == [(96, "<tool_call>"), (97, "</tool_call>"), (98, "<think>")]
    assert json.loads((out / "llama-vocab-grown" / "config.json").read_text())["vocab_size"] == 99


def test_run_twice_gives_identical_bytes(workspace: Path) -> None:
    recipe = str(workspace / "recipes" / "bert-to-burn.yaml")
    assert main(["run", recipe, "--no-progress"]) == 0
    first = (workspace / "demo-out" / "tiny-bert.bpk").read_bytes()
    assert main(["run", recipe, "--no-progress"]) == 0
    assert (workspace / "demo-out" / "tiny-bert.bpk").read_bytes() == first


_cli = migrate_subprocess


def test_exit_codes_report_file_and_untouched_target(workspace: Path) -> None:
    recipes = workspace / "recipes"
    bad = recipes / "bad.yaml"
    bad.write_text("version: 1\nsource:\n  path: ../demo-out/mlp.pt\ntarget:\n  path: x.bpk\n  overwite: true\n")
    out = _cli("run", str(bad), cwd=workspace)
    assert out.returncode == 2
    assert "bad.yaml:6:3: target.overwite: unknown key 'overwite'" in out.stderr and "overwrite" in out.stderr

    # a template the source cannot fill: exit 1, nothing written over the existing target
    target = workspace / "demo-out" / "classifier.bpk"
    target.write_bytes(b"keep me")
    strict = recipes / "strict.yaml"
    text = (recipes / "encoder-surgery.yaml").read_text()
    strict.write_text(text.replace("allow_partial: true", "allow_partial: false"))
    report = workspace / "report.json"
    out = _cli("run", str(strict), "--report", str(report), cwd=workspace)
    assert out.returncode == 1, out.stderr
    assert "classifier.weight" in out.stdout and "allow_partial" in out.stderr
    assert target.read_bytes() == b"keep me"
    data = json.loads(report.read_text())
    assert set(data) == {"applied", "skipped", "missing", "unused", "errors", "status", "target", "written", "tensors"}
    assert data["status"] == "failed" and data["written"] is False  # a failed run's report says so
    assert data["errors"] and any("allow_partial" in e["message"] for e in data["errors"])
    assert [m["path"] for m in data["missing"]] == ["classifier.bias", "classifier.weight"]
    assert len(data["applied"]) == 16 and len(data["skipped"]) == 24


def test_plan_json_writes_nothing(workspace: Path) -> None:
    out = _cli("plan", str(workspace / "recipes" / "bert-to-burn.yaml"), "--json", cwd=workspace)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    q = next(e for e in plan["entries"] if e["target"] == "encoder.layers.0.mha.query.weight")
    assert q["source"] == "encoder.layer.0.attention.self.query.weight"
    assert q["module"] == {"type": "Linear", "how": "declared", "reason": q["module"]["reason"]}
    assert any(op.startswith("transpose") for op in q["ops"])
    assert plan["report"]["skipped"] == ["embeddings.position_ids"]
    assert not (workspace / "demo-out" / "tiny-bert.bpk").exists()


def test_emit_recipe_reproduces_convert(workspace: Path) -> None:
    src = workspace / "demo-out" / "mlp.pt"
    args = [str(src), str(workspace / "a.bpk"), "--remap", r"^model\.net\.=layers.", "--contiguous-indices",
            "--exclude", r"\.bias$", "--dtype", "F16"]
    out = _cli("convert", *args, "--emit-recipe", cwd=workspace)
    assert out.returncode == 0, out.stderr
    (workspace / "emitted.yaml").write_text(out.stdout.replace("a.bpk", "b.bpk"))
    assert _cli("convert", *args, cwd=workspace).returncode == 0
    assert _cli("run", "emitted.yaml", cwd=workspace).returncode == 0
    a, b = open_file(workspace / "a.bpk"), open_file(workspace / "b.bpk")
    assert a.names() == b.names() == ["layers.0.weight", "layers.1.weight", "layers.2.weight"]
    assert all(bytes(x.data()) == bytes(y.data()) and x.dtype.display == "F16"
               for x, y in zip(a.values(), b.values(), strict=True))


def test_validate_reports_each_recipe(workspace: Path) -> None:
    out = _cli("validate", *(str(workspace / "recipes" / f"{n}.yaml") for n in ORDER[:1] + ORDER[2:4]),
               cwd=workspace)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(": ok (") == 3
    missing = _cli("validate", str(workspace / "recipes" / "burn-to-bert.yaml"), cwd=workspace)
    assert missing.returncode == 1 and "tiny-bert.bpk" in missing.stderr

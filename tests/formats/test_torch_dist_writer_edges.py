"""The torch_dist target's folder-level promises, without megatron: published whole (a kill at any tensor
leaves the old checkpoint or none), streamed (a Llama's layers fused and stacked by the recipe in bounded
memory). Oracles: the old folder's bytes; torch's `dcp.load` of the new one against the tensors rearranged
by torch; the process's own peak RSS (VmHWM)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
st_torch = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "hf-llama-to-megatron.yaml"


def files(folder: Path) -> dict[str, str]:
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in sorted(os.listdir(folder))}


def test_killed_at_each_tensor_the_target_is_the_old_checkpoint_or_none(tmp_path: Path) -> None:
    """SIGKILL after the k-th tensor (`MIGRATOR_KILL_AT=tensor:k`, the last one included: before `.metadata`,
    `metadata.json`, `common.pt` and the publish): the old checkpoint byte for byte."""
    from migrator.storage.atomic_folder import SCRATCH_DIR_RE

    new = {f"decoder.layers.mlp.linear_fc{i}.weight": torch.randn(2, 16, 8) for i in (1, 2)}
    new["output_layer.weight"] = torch.randn(32, 8)
    st_torch.save_file(new, tmp_path / "new.safetensors")
    st_torch.save_file({"decoder.layers.self_attention.linear_proj.weight": torch.randn(3, 4, 4)},
                       tmp_path / "old.safetensors")
    out = tmp_path / "ckpt"
    first = migrate_in_process("convert", str(tmp_path / "old.safetensors"), str(out), "--to", "torch_dist")
    assert first.returncode == 0, first.stderr
    old = files(out)
    assert sorted(old) == [".metadata", "__0_0.distcp", "common.pt", "metadata.json"]
    cmd = [sys.executable, "-m", "migrator.cli", "convert", str(tmp_path / "new.safetensors"), str(out), "--to",
           "torch_dist", "--no-progress", "--overwrite"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for k in range(1, len(new) + 1):
        done = subprocess.run(cmd, env={**env, "MIGRATOR_KILL_AT": f"tensor:{k}"}, capture_output=True, timeout=120,
                              check=False)
        assert done.returncode == -9, done.stderr
        assert files(out) == old, k
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert not [n for n in os.listdir(tmp_path) if SCRATCH_DIR_RE.match(n)]
    into = {k: torch.zeros_like(v) for k, v in new.items()}
    dcp.load(into, checkpoint_id=str(out), no_dist=True)
    assert all(torch.equal(into[k], v) for k, v in new.items())


MEMORY_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from migrator.api import run_recipe
    import migrator.formats.dcp.megatron, migrator.formats.safetensors  # imported before the baseline

    def peak_kib():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])

    before = peak_kib()
    run_recipe(sys.argv[2], source=sys.argv[3], target=sys.argv[4])
    print(peak_kib() - before)
""")
H, LAYERS, FFN, VOCAB, HEADS, KV = 512, 4, 1536, 8192, 8, 2


@pytest.mark.slow
def test_the_recipe_streams_within_bounded_memory(tmp_path: Path) -> None:
    """A 78 MiB Llama through the recipe (reshape, concat, stack: every output computed): the peak RSS grows
    by less than its largest output tensor (linear_fc1 stacked, 24 MiB) plus 48 MiB; what torch reads back
    is the Hugging Face tensors rearranged by torch."""
    g = torch.Generator().manual_seed(0)
    hd = H // HEADS
    hf = {"model.embed_tokens.weight": torch.randn(VOCAB, H, generator=g),
          "lm_head.weight": torch.randn(VOCAB, H, generator=g), "model.norm.weight": torch.randn(H, generator=g)}
    shapes = {"self_attn.q_proj": (HEADS * hd, H), "self_attn.k_proj": (KV * hd, H), "self_attn.v_proj": (KV * hd, H),
              "self_attn.o_proj": (H, H), "mlp.gate_proj": (FFN, H), "mlp.up_proj": (FFN, H), "mlp.down_proj": (H, FFN),
              "input_layernorm": (H,), "post_attention_layernorm": (H,)}
    for i in range(LAYERS):
        for name, shape in shapes.items():
            hf[f"model.layers.{i}.{name}.weight"] = torch.randn(*shape, generator=g)
    (tmp_path / "hf").mkdir()
    st_torch.save_file(hf, tmp_path / "hf" / "model.safetensors")
    (tmp_path / "hf" / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": H, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "vocab_size": VOCAB}))
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(REPO), str(RECIPE), str(tmp_path / "hf"),
                          f"{tmp_path / 'out'}/"], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    growth_mib = int(out.stdout.split()[-1]) / 1024
    print(f"peak RSS growth {growth_mib:.1f} MiB")
    assert growth_mib < 24 + 48, f"peak RSS grew {growth_mib:.0f} MiB writing a 78 MiB model"

    def per_layer(name: str) -> torch.Tensor:
        return torch.stack([hf[f"model.layers.{i}.{name}.weight"] for i in range(LAYERS)])

    qkv = [torch.cat([hf[f"model.layers.{i}.self_attn.{p}_proj.weight"].view(KV, -1, H) for p in "qkv"], dim=1)
           .reshape(-1, H) for i in range(LAYERS)]
    expected = {
        "embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
        "output_layer.weight": hf["lm_head.weight"], "decoder.final_layernorm.weight": hf["model.norm.weight"],
        "decoder.layers.self_attention.linear_qkv.weight": torch.stack(qkv),
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight": per_layer("input_layernorm"),
        "decoder.layers.self_attention.linear_proj.weight": per_layer("self_attn.o_proj"),
        "decoder.layers.mlp.linear_fc1.weight": torch.cat([per_layer("mlp.gate_proj"), per_layer("mlp.up_proj")],
                                                          dim=1),
        "decoder.layers.mlp.linear_fc1.layer_norm_weight": per_layer("post_attention_layernorm"),
        "decoder.layers.mlp.linear_fc2.weight": per_layer("mlp.down_proj")}
    into = {k: torch.zeros_like(v) for k, v in expected.items()}
    dcp.load(into, checkpoint_id=str(tmp_path / "out"), no_dist=True)
    for k, v in expected.items():
        assert torch.equal(into[k], v), k

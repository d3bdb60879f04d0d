"""Writing K-quants (Q2_K..Q6_K) and llama.cpp's K-quant mixes, without llama.cpp: blocks read back by
gguf-py's reference dequantizer (`gguf.quants.dequantize`) within each type's error bound, and the
mixes' per-tensor types by llama-quantize's rules on names and shapes (the layout llama.cpp gives
Llama 3 8B). Byte equality with ggml's own quantizers and with llama-quantize's files is checked in
test_gguf_llamacpp.py (`make test-llamacpp`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from migrator.core.errors import UnsupportedDTypeError
from migrator.core.tensor import from_numpy
from migrator.formats.gguf import quants
from migrator.formats.gguf.constants import BY_NAME
from migrator.formats.gguf.mixes import mix_types, use_more_bits
from migrator.formats.gguf.writer import GGUFWriter
from tests.support.cli import migrate_in_process
from tests.support.models import tiny_llama

gguf = pytest.importorskip("gguf")
GQ = gguf.GGMLQuantizationType

# (rms error / rms value, max error / block range) on normal values, about 1.2x what the types give
BOUNDS = {"Q2_K": (0.35, 0.25), "Q3_K": (0.18, 0.12), "Q4_K": (0.085, 0.05), "Q5_K": (0.045, 0.03),
          "Q6_K": (0.022, 0.012)}


@pytest.fixture(autouse=True)
def kernels() -> None:
    if quants._kernels() is None:
        pytest.skip("K-quants are written by the compiled kernels, which are not built")


def round_trip(x: np.ndarray, name: str) -> np.ndarray:
    q = quants.quantize(x, BY_NAME[name])
    assert q.size == x.size // 256 * BY_NAME[name].type_size
    return gguf.quants.dequantize(q.reshape(len(x), -1), GQ[name]).reshape(x.shape)


@pytest.mark.parametrize("name", quants.K_QUANTIZED)
def test_round_trip_through_gguf_py_within_bounds(name: str) -> None:
    x = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32) * np.float32(0.02)
    err = round_trip(x, name) - x
    rms_bound, max_bound = BOUNDS[name]
    assert np.sqrt((err**2).mean() / (x**2).mean()) < rms_bound
    blocks, errs = x.reshape(-1, 256), np.abs(err).reshape(-1, 256)
    assert (errs.max(axis=1) / (blocks.max(axis=1) - blocks.min(axis=1))).max() < max_bound


@pytest.mark.parametrize("name", quants.K_QUANTIZED)
def test_hostile_blocks_round_trip(name: str) -> None:
    rng = np.random.default_rng(1)
    normal = rng.standard_normal((4, 256)).astype(np.float32)
    zeros = np.zeros((2, 256), np.float32)
    assert np.array_equal(round_trip(zeros, name), zeros)
    constant = np.full((2, 256), -0.75, np.float32)
    assert np.allclose(round_trip(constant, name), constant, atol=0.75 * BOUNDS[name][1] * 2)
    for label, x in {"negative": -np.abs(normal), "huge": normal * np.float32(1e4), "small": normal * np.float32(1e-2),
                     "outlier": np.where(np.arange(256) == 7, np.float32(500), normal)}.items():
        got = round_trip(x, name)
        assert np.isfinite(got).all(), label
        scale = np.abs(x).max(axis=1, keepdims=True)
        assert (np.abs(got - x) / scale).max() < 0.6, label  # every type keeps the block's extremes
    for tiny in (normal * np.float32(1e-20), normal * np.float32(1e-41)):  # f16 scales flush to zero
        assert np.abs(round_trip(tiny, name)).max() <= np.abs(tiny).max()


def test_large_inputs_split_over_threads_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quants, "_workers", lambda: 3)
    x = np.random.default_rng(2).standard_normal(quants.SPLIT_VALUES + 3 * 256).astype(np.float32)
    err = round_trip(x.reshape(-1, 256), "Q4_K").reshape(-1) - x
    assert np.sqrt((err**2).mean() / (x**2).mean()) < BOUNDS["Q4_K"][0]


def test_k_quants_refused_without_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    from migrator.core import native

    monkeypatch.setattr(native, "kernels", None)
    t = [from_numpy("blk.0.ffn_up.weight", np.ones((2, 256), np.float32))]
    with pytest.raises(UnsupportedDTypeError, match="Q4_K needs migrator's compiled kernels"):
        GGUFWriter(t, quantize={".*": "Q4_K"})
    with pytest.raises(UnsupportedDTypeError, match="compiled kernels"):
        GGUFWriter(t, quantize="Q4_K_M")
    # numpy writes the other quantized types
    assert GGUFWriter(t, quantize={".*": "Q8_0"}).ggml_types() == {"blk.0.ffn_up.weight": "Q8_0"}


def llama_tensors(layers: int, hidden: int, ffn: int, vocab: int, kv: int,
                  output: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of a Llama GGUF in llama.cpp's names, rows last."""
    t: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, hidden)), ("output_norm.weight", (hidden,))]
    if output:
        t.append(("output.weight", (vocab, hidden)))
    for i in range(layers):
        t += [(f"blk.{i}.attn_norm.weight", (hidden,)), (f"blk.{i}.attn_q.weight", (hidden, hidden)),
              (f"blk.{i}.attn_k.weight", (kv, hidden)), (f"blk.{i}.attn_v.weight", (kv, hidden)),
              (f"blk.{i}.attn_output.weight", (hidden, hidden)), (f"blk.{i}.ffn_norm.weight", (hidden,)),
              (f"blk.{i}.ffn_gate.weight", (ffn, hidden)), (f"blk.{i}.ffn_up.weight", (ffn, hidden)),
              (f"blk.{i}.ffn_down.weight", (hidden, ffn))]
    return t


LLAMA3_8B = llama_tensors(32, 4096, 14336, 128256, 1024)
# the layers whose attn_v and ffn_down llama.cpp's Q4_K_M of a 32-layer Llama writes Q6_K (what
# llama-quantize prints for Llama 3 8B: the first and last 4, and every third in between)
MORE_BITS_32 = [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


@pytest.mark.parametrize(("mix", "base", "more", "bumped"), [
    ("Q4_K_M", "Q4_K", MORE_BITS_32, "Q6_K"), ("Q5_K_M", "Q5_K", MORE_BITS_32, "Q6_K"),
    ("Q4_K_S", "Q4_K", [0, 1, 2, 3], "Q5_K"), ("Q5_K_S", "Q5_K", [], ""), ("Q6_K", "Q6_K", [], "")])
def test_mix_types_of_a_32_layer_llama(mix: str, base: str, more: list[int], bumped: str) -> None:
    types = mix_types(mix, LLAMA3_8B)
    assert "output_norm.weight" not in types and "blk.0.attn_norm.weight" not in types  # kept as they are (F32)
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == base
    for i in range(32):
        for role in ("attn_v", "ffn_down"):
            assert types[f"blk.{i}.{role}.weight"] == (bumped if i in more else base), (role, i)
        for role in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert types[f"blk.{i}.{role}.weight"] == base


@pytest.mark.parametrize(("mix", "base", "v", "down", "out"), [
    ("Q3_K_S", "Q3_K", "Q3_K", "Q3_K", "Q3_K"), ("Q3_K_L", "Q3_K", "Q5_K", "Q5_K", "Q5_K"),
    ("Q2_K", "Q2_K", "Q3_K", "Q3_K", "Q3_K")])
def test_q2_q3_mixes(mix: str, base: str, v: str, down: str, out: str) -> None:
    types = mix_types(mix, LLAMA3_8B)
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == base
    assert {types[f"blk.{i}.attn_v.weight"] for i in range(32)} == {v}
    assert {types[f"blk.{i}.ffn_down.weight"] for i in range(32)} == {down}
    assert {types[f"blk.{i}.attn_output.weight"] for i in range(32)} == {out}
    assert {types[f"blk.{i}.attn_q.weight"] for i in range(32)} == {base}


def test_q3_k_m_and_q2_k_with_grouped_query_attention() -> None:
    types = mix_types("Q3_K_M", LLAMA3_8B)
    assert [types[f"blk.{i}.attn_v.weight"] for i in range(4)] == ["Q5_K", "Q5_K", "Q4_K", "Q4_K"]
    assert [types[f"blk.{i}.ffn_down.weight"] for i in range(3)] == ["Q5_K", "Q5_K", "Q4_K"]  # first 32/16
    assert types["blk.5.attn_output.weight"] == "Q4_K" and types["blk.5.attn_q.weight"] == "Q3_K"
    gqa = {"general.architecture": "llama", "llama.attention.head_count": 32, "llama.attention.head_count_kv": 8}
    assert mix_types("Q2_K", LLAMA3_8B, gqa)["blk.0.attn_v.weight"] == "Q4_K"  # 4 query heads per KV head


def test_mix_on_an_expert_model_says_llama_cpp_may_differ() -> None:
    t = [from_numpy("blk.0.ffn_up.weight", np.ones((2, 256), np.float32))]
    meta = {"general.architecture": "llama", "llama.expert_count": "8"}
    assert any("8-expert model" in n for n in GGUFWriter(t, quantize="Q4_K_M", metadata=meta).notes)
    dense = GGUFWriter(t, quantize="Q4_K_M", metadata={"general.architecture": "llama"})
    assert not any("expert" in n for n in dense.notes)


def test_use_more_bits() -> None:
    assert [i for i in range(32) if use_more_bits(i, 32)] == MORE_BITS_32
    assert [i for i in range(8) if use_more_bits(i, 8)] == [0, 3, 6, 7]


def test_mix_rules_for_tied_embeddings_odd_rows_and_70b() -> None:
    tied = mix_types("Q4_K_M", llama_tensors(2, 256, 512, 300, 128, output=False))
    assert tied["token_embd.weight"] == "Q6_K"  # it is the output projection too
    odd = mix_types("Q4_K_M", llama_tensors(2, 160, 320, 300, 80))  # rows of 160: not 256-value blocks
    assert odd["output.weight"] == "Q8_0" and odd["blk.0.attn_q.weight"] == "Q5_0"
    assert odd["blk.0.attn_v.weight"] == "Q5_0"
    assert odd["blk.1.attn_v.weight"] == odd["blk.1.ffn_down.weight"] == "Q8_0"  # a more-bits layer: Q6_K's fallback
    assert mix_types("Q5_K_S", llama_tensors(1, 160, 320, 300, 80))["blk.0.attn_q.weight"] == "Q5_1"
    assert mix_types("Q4_K_M", llama_tensors(1, 80, 160, 300, 40))["blk.0.attn_q.weight"] == "F16"  # not 32 either
    meta = {"general.architecture": "llama", "llama.block_count": 80, "llama.attention.head_count": 64,
            "llama.attention.head_count_kv": 8}
    big = mix_types("Q4_K_M", llama_tensors(80, 256, 512, 300, 128), meta)
    assert big["blk.11.attn_v.weight"] == "Q5_K"  # not a more-bits layer: Q4_K, raised for a 70B
    assert big["blk.11.ffn_down.weight"] == "Q4_K" and big["blk.10.ffn_down.weight"] == "Q4_K"


def test_convert_hf_folder_with_a_mix(tmp_path: Path) -> None:
    """`migrate convert hf/ out.gguf --quantize Q4_K_M`: llama.cpp's file type, the mix's types, values
    near the model's (dequantized by gguf-py), norms F32; the plan lists the types."""
    pytest.importorskip("transformers")
    model = tiny_llama(layers=8, hidden=256, vocab=300)
    model.save_pretrained(tmp_path / "hf")
    out = tmp_path / "m.gguf"
    res = migrate_in_process("convert", str(tmp_path / "hf"), str(out), "--quantize", "q4_k_m")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "blk.N.attn_v.weight Q6_K in blocks 0, 3, 6, 7, else Q4_K" in res.stdout + res.stderr  # the plan's note
    r = gguf.GGUFReader(str(out))
    assert int(r.fields["general.file_type"].contents()) == 15
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert [i for i in range(8) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"] == [0, 3, 6, 7]
    assert types["output.weight"] == "Q6_K" and types["blk.1.attn_q.weight"] == "Q4_K"
    assert types["blk.0.attn_norm.weight"] == types["output_norm.weight"] == "F32"
    down = next(t for t in r.tensors if t.name == "blk.1.ffn_down.weight")
    values = gguf.quants.dequantize(np.asarray(down.data), down.tensor_type)
    original = model.state_dict()["model.layers.1.mlp.down_proj.weight"].numpy()
    assert values.shape == original.shape
    assert np.sqrt(((values - original) ** 2).mean() / (original**2).mean()) < BOUNDS["Q4_K"][0]

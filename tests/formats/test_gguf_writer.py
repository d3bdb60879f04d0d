"""Writing GGUF, checked by gguf-py: its reader reads what migrator writes (metadata, types, shapes,
data), quantized bytes equal `gguf.quants.quantize` of the same F32 values, llama.cpp's per-tensor
conventions, and the `migrate` commands (convert --quantize, inspect --json, diff)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import migrator
from migrator.core.errors import PlanError, UnsupportedDTypeError
from migrator.core.tensor import from_numpy
from migrator.files.io import save_planned
from migrator.formats.gguf.writer import GGUFWriter
from migrator.run.convert import convert
from tests.support.cli import migrate_in_process
from tests.support.gguf_files import write_gguf

gguf = pytest.importorskip("gguf")
GQ = gguf.GGMLQuantizationType


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "token_embd.weight": rng.standard_normal((16, 64)).astype(np.float32),
        "blk.0.attn_norm.weight": rng.standard_normal(64).astype(np.float32),
        "blk.0.attn_q.weight": rng.standard_normal((64, 64)).astype(np.float32),
        "blk.0.ffn_up.weight": rng.standard_normal((2, 96, 64)).astype(np.float32),
        "odd.weight": rng.standard_normal((4, 40)).astype(np.float32),  # rows not whole blocks of 32
        "positions": np.arange(12, dtype=np.int32).reshape(3, 4),
    }


def read_back(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...], bytes]], object]:
    r = gguf.GGUFReader(str(path))
    tensors = {t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())),
                        np.asarray(t.data).tobytes()) for t in r.tensors}
    return tensors, r


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16", "F32"])
def test_gguf_py_reads_what_migrator_writes(tmp_path: Path, qtype: str) -> None:
    w = weights()
    out = tmp_path / "m.gguf"
    migrator.save(w, tmp_path / "m.safetensors")
    result = convert(tmp_path / "m.safetensors", out, quantize=qtype,
                     metadata={"general.architecture": "llama", "general.name": "tiny", "llama.block_count": "1",
                               "llama.attention.layer_norm_rms_epsilon": "1e-05"})
    tensors, r = read_back(out)
    assert set(tensors) == set(w)
    for name, values in w.items():
        got_type, shape, data = tensors[name]
        assert shape == values.shape, name
        if values.dtype != np.float32:  # non-float tensors keep their type
            assert (got_type, data) == ("I32", values.tobytes())
        elif values.ndim < 2 or "norm" in name:  # llama.cpp keeps 1-D tensors and norms F32
            assert (got_type, data) == ("F32", values.tobytes())
        elif values.shape[-1] % 32 and qtype not in ("F16", "BF16", "F32"):  # not whole blocks: F16
            assert (got_type, data) == ("F16", values.astype(np.float16).tobytes())
            assert any("odd.weight" in n and "F16" in n for n in result.notes)
        else:
            assert got_type == qtype, name
            assert data == gguf.quants.quantize(values, GQ[qtype]).tobytes(), name
    fields = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert fields["general.architecture"] == "llama" and fields["general.name"] == "tiny"
    assert r.fields["llama.block_count"].types == [gguf.GGUFValueType.UINT32] and fields["llama.block_count"] == 1
    assert r.fields["llama.attention.layer_norm_rms_epsilon"].types == [gguf.GGUFValueType.FLOAT32]
    assert fields["general.quantization_version"] == 2
    file_types = {"Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "F16": 1, "BF16": 32, "F32": 0}
    assert fields["general.file_type"] == file_types[qtype]


def test_without_rules_every_tensor_keeps_its_dtype(tmp_path: Path) -> None:
    w = {"a": np.ones((2, 32), np.float32), "b": np.ones((3, 5), np.float16), "c": np.arange(4, dtype=np.int64)}
    out = tmp_path / "k.gguf"
    migrator.save(w, out, metadata={"general.architecture": "llama"})
    tensors, _ = read_back(out)
    assert {k: v[0] for k, v in tensors.items()} == {"a": "F32", "b": "F16", "c": "I64"}
    assert all(tensors[k][2] == w[k].tobytes() for k in w)


def test_gguf_to_gguf_keeps_typed_metadata(tmp_path: Path) -> None:
    """Every key/value of a gguf-py file (strings, arrays of strings and floats, ints, bools) is
    written back with its type and value; quantized tensors come back as F32 values."""
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    src = write_gguf(tmp_path / "src.gguf", {"w": (x, "Q8_0"), "n": (x[0].copy(), "F32")},
                     kv={"general.name": "src", "llama.context_length": 128,
                         "tokenizer.ggml.tokens": ["<s>", "</s>", "\u2581hi", "\u00e9"],
                         "tokenizer.ggml.scores": [0.0, -1.5, 2.25, 3.0],
                         "tokenizer.ggml.add_bos_token": True,
                         "tokenizer.ggml.token_type": [1, 3, 1, 1],
                         "custom.i64": (-5, gguf.GGUFValueType.INT64), "custom.nested": [[1, 2], [3]]})
    out = tmp_path / "out.gguf"
    convert(src, out)
    a, b = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(out))
    for key, field in a.fields.items():
        if key.startswith("GGUF."):
            continue
        assert b.fields[key].types == field.types, key
        assert b.fields[key].contents() == field.contents(), key
    tensors, _ = read_back(out)
    assert tensors["w"] == read_back(src)[0]["w"]  # the Q8_0 blocks, as stored


def test_gguf_to_gguf_passes_quantized_blocks_through(tmp_path: Path) -> None:
    """Unchanged (or only renamed) quantized tensors keep their blocks; a cast or a rule re-makes them."""
    x = np.random.default_rng(4).standard_normal((4, 256)).astype(np.float32)
    blocks = np.random.default_rng(5).integers(0, 256, (4, 144), dtype=np.uint8)
    blocks[:, :4] = np.float16([[0.5, 0.1]] * 4).view(np.uint8)
    src = write_gguf(tmp_path / "src.gguf", {"a": (x, "Q4_0"), "k": (blocks, "Q4_K")})
    theirs = read_back(src)[0]
    out = tmp_path / "renamed.gguf"
    result = convert(src, out, remaps=["^a$=b"])
    ours = read_back(out)[0]
    assert ours["b"] == theirs["a"] and ours["k"] == theirs["k"]
    assert any("stored ggml types" in n for n in result.notes)
    out = tmp_path / "f16.gguf"
    convert(src, out, dtype="F16")
    ours = read_back(out)[0]
    ref = gguf.quants.dequantize(blocks, GQ.Q4_K).astype(np.float16)
    assert ours["k"][0] == "F16" and ours["k"][2] == ref.tobytes()
    out = tmp_path / "q8.gguf"
    convert(src, out, quantize="Q8_0")
    ours = read_back(out)[0]
    assert ours["k"][2] == gguf.quants.quantize(gguf.quants.dequantize(blocks, GQ.Q4_K), GQ.Q8_0).tobytes()


def test_alignment_from_metadata(tmp_path: Path) -> None:
    out = tmp_path / "a.gguf"
    migrator.save({"a": np.ones(3, np.float32), "b": np.ones(5, np.float32)}, out,
                  metadata={"general.alignment": "64", "general.architecture": "llama"})
    r = gguf.GGUFReader(str(out))
    assert r.alignment == 64 and all(t.data_offset % 64 == 0 for t in r.tensors)
    assert [np.asarray(t.data).tolist() for t in r.tensors] == [[1.0] * 3, [1.0] * 5]


def test_bad_rules_and_dtypes_refused() -> None:
    t = [from_numpy("w", np.ones((2, 32), np.float32))]
    with pytest.raises(PlanError, match="IQ2_XS"):
        GGUFWriter(t, quantize={".*": "IQ2_XS"})
    with pytest.raises(PlanError, match="unknown quantization mix 'Q7_K_M'"):
        GGUFWriter(t, quantize="Q7_K_M")
    with pytest.raises(PlanError, match="regex"):
        GGUFWriter(t, quantize={"(": "Q8_0"})
    with pytest.raises(PlanError, match="UINT32"):
        GGUFWriter(t, metadata={"llama.block_count": "many"})
    with pytest.raises(UnsupportedDTypeError, match="U8"):
        GGUFWriter([from_numpy("b", np.ones(3, np.uint8))])


def test_memory_does_not_grow_with_tensor_count(tmp_path: Path) -> None:
    """Quantizing 8 tensors of 2 MiB holds about one tensor's worth, not eight."""
    rng = np.random.default_rng(2)
    src = tmp_path / "big.safetensors"
    migrator.save({f"w{i}": rng.standard_normal((512, 1024)).astype(np.float32) for i in range(8)}, src)
    with migrator.open_file(src) as r:
        writer = GGUFWriter(r.tensors, quantize={".*": "Q8_0"}, metadata={"general.architecture": "llama"})
        tracemalloc.start()
        save_planned(writer, tmp_path / "big.gguf")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 12 << 20, peak  # 16 MiB of input


def test_cli_convert_inspect_diff(tmp_path: Path) -> None:
    x = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    src = write_gguf(tmp_path / "s.gguf", {"w": (x, "Q4_0"), "b": (x[0].copy(), "F32")},
                     kv={"tokenizer.ggml.tokens": [f"t{i}" for i in range(50)]})
    res = migrate_in_process("inspect", str(src), "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["format"] == "gguf"
    assert [(t["name"], t["ggml_type"], t["dtype"]) for t in info["tensors"]] == [("w", "Q4_0", "F32"),
                                                                                ("b", "F32", "F32")]
    assert info["metadata"]["tokenizer.ggml.tokens"].startswith("[50 x STRING:")
    assert info["details"]["metadata_types"]["tokenizer.ggml.tokens"] == "ARRAY[STRING] x 50"
    assert info["details"]["metadata_types"]["general.architecture"] == "STRING"
    res = migrate_in_process("inspect", str(src))
    assert res.returncode == 0 and "Q4_0" in res.stdout and "ggml type" in res.stdout
    bpk = tmp_path / "s.bpk"
    assert migrate_in_process("convert", str(src), str(bpk)).returncode == 0
    q = tmp_path / "q.gguf"
    res = migrate_in_process("convert", str(bpk), str(q), "--quantize", "Q8_0", "--metadata",
                             "general.architecture=llama")
    assert res.returncode == 0, res.stderr
    assert read_back(q)[0]["w"][0] == "Q8_0"
    res = migrate_in_process("diff", str(src), str(bpk))
    assert res.returncode == 0, res.stdout + res.stderr
    res = migrate_in_process("convert", str(src), str(tmp_path / "x.safetensors"), "--quantize", "Q8_0")
    assert res.returncode == 2 and "GGUF" in res.stderr + res.stdout
    res = migrate_in_process("convert", str(src), str(tmp_path / "y.gguf"), "--quantize", "Q9_9")
    assert res.returncode == 2 and "--quantize" in res.stderr + res.stdout


def test_notes_name_types_and_long_names() -> None:
    t = [from_numpy("blk.0.w", np.ones((2, 32), np.float32)), from_numpy("n" * 64, np.ones((2, 32), np.float32)),
         from_numpy("norm.weight", np.ones(32, np.float32))]
    w = GGUFWriter(t, quantize={".*": "Q8_0"}, metadata={"general.architecture": "llama"})
    assert "GGUF types written: 2 x Q8_0, 1 x F32" in w.notes
    assert any("longer than 63 bytes" in n for n in w.notes)
    with pytest.raises(PlanError, match="surrogate"):
        GGUFWriter([from_numpy("bad\ud800", np.ones(2, np.float32))])

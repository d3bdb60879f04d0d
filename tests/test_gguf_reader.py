"""Reading GGUF files gguf-py wrote: every ggml type, values bit-equal to gguf-py's reader plus
`gguf.quants.dequantize`, PyTorch-order shapes, metadata, zero-copy views, streamed pieces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf_support import gguf_reference, random_blocks, write_gguf

import migrator
from migrator.convert import convert
from migrator.formats.gguf.constants import BY_NAME
from migrator.formats.gguf.quants import DEQUANTIZERS, QUANTIZERS

gguf = pytest.importorskip("gguf")


def every_type_file(path: Path) -> Path:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 512)).astype(np.float32)
    tensors: dict[str, tuple[np.ndarray, str]] = {
        "plain.f32": (x, "F32"), "plain.f16": (x.astype(np.float16), "F16"), "plain.bf16": (x, "BF16"),
        "plain.f64": (x.astype(np.float64)[:2], "F64"),
        "plain.i8": (np.arange(24, dtype=np.int8).reshape(2, 3, 4), "I8"),
        "plain.i16": (np.arange(6, dtype=np.int16), "I16"), "plain.i32": (np.arange(6, dtype=np.int32), "I32"),
        "plain.i64": (np.arange(6, dtype=np.int64).reshape(1, 2, 3), "I64"), "scalar": (np.float32([3.5]), "F32"),
    }
    for name in [*sorted(QUANTIZERS), "TQ1_0", "TQ2_0", "MXFP4"]:
        tensors[f"q.{name}"] = (x, name)
    for name in sorted(set(DEQUANTIZERS) - set(QUANTIZERS) - {"TQ1_0", "TQ2_0", "MXFP4"}):
        t = BY_NAME[name]
        rows, per_row = 3, 2  # blocks per row
        tensors[f"raw.{name}"] = (random_blocks(name, rows * per_row).reshape(rows, per_row * t.type_size), name)
    return write_gguf(path, tensors, kv={"general.name": "every type", "llama.block_count": 2,
                                        "tokenizer.ggml.tokens": [f"tok{i}" for i in range(100)],
                                        "tokenizer.ggml.scores": [float(i) / 3 for i in range(100)]})


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype.itemsize == b.dtype.itemsize and a.tobytes() == b.tobytes()


def test_every_type_reads_as_gguf_py_reads_it(tmp_path: Path) -> None:
    path = every_type_file(tmp_path / "all.gguf")
    ref = gguf_reference(path)
    with migrator.open_file(path) as r:
        assert r.format == "gguf"
        assert r.names() == list(ref)
        for t in r.tensors:
            ggml_type, values = ref[t.name]
            assert r.ggml_type(t) == ggml_type, t.name
            ours = t.numpy()
            if BY_NAME[ggml_type].quantized:
                assert t.dtype.name == "F32" and t.span is None
                values = values.astype(np.float32)
            else:
                assert t.span is not None  # a view of the file, not a copy
            if ggml_type == "BF16":
                ours = ours.astype(np.float32)
            assert same_bits(ours, values.astype(ours.dtype)), t.name
            if t.chunks is not None:  # the streamed pieces are the same bytes
                assert b"".join(bytes(p) for p in t.chunks()) == bytes(t.data()), t.name


def test_shapes_are_pytorch_order(tmp_path: Path) -> None:
    x = np.arange(2 * 3 * 64, dtype=np.float32).reshape(2, 3, 64)
    path = write_gguf(tmp_path / "s.gguf", {"w": (x, "F32"), "q": (x, "Q8_0")})
    with migrator.open_file(path) as r:
        assert r["w"].shape == (2, 3, 64) and r["q"].shape == (2, 3, 64)
        assert np.array_equal(r["w"].numpy(), x)
    assert list(gguf.GGUFReader(str(path)).tensors[0].shape) == [64, 3, 2]  # GGUF's own order


def test_metadata_typed_and_summarised(tmp_path: Path) -> None:
    path = every_type_file(tmp_path / "all.gguf")
    ref = gguf.GGUFReader(str(path))
    with migrator.open_file(path) as r:
        meta = r.metadata
        for key, field in ref.fields.items():
            if key.startswith("GGUF."):
                continue
            value = meta[key]
            assert value.type.value == field.types[0].value, key
            contents = field.contents()
            data = value.data
            if hasattr(data, "tolist"):
                data = data.tolist()
            if isinstance(contents, list) and contents and isinstance(contents[0], float):
                assert np.array_equal(np.float32(data), np.float32(contents)), key
            else:
                assert data == contents, key
        assert meta["general.name"] == "every type"
        assert meta["llama.block_count"] == "2"
        assert meta["tokenizer.ggml.tokens"].startswith("[100 x STRING: 'tok0', 'tok1'")
        assert r.extra()["alignment"] == 32


def test_custom_alignment_honoured(tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((3, 32)).astype(np.float32)
    path = write_gguf(tmp_path / "a.gguf", {"a": (x[:, :5].copy(), "F32"), "b": (x, "Q8_0")}, alignment=64)
    ref = gguf_reference(path)
    with migrator.open_file(path) as r:
        assert r.extra()["alignment"] == 64
        assert r["a"].span.offset % 64 == 0
        assert same_bits(r["b"].numpy(), ref["b"][1])


def test_dtype_cast_of_quantized_source(tmp_path: Path) -> None:
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    path = write_gguf(tmp_path / "q.gguf", {"q": (x, "Q4_0")})
    out = tmp_path / "q.safetensors"
    convert(path, out, dtype="F16")
    ref = gguf_reference(path)["q"][1]
    with migrator.open_file(out) as r:
        assert r["q"].dtype.name == "F16"
        assert np.array_equal(r["q"].numpy(), ref.astype(np.float16))

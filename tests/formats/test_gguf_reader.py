"""Reading GGUF files gguf-py wrote: every ggml type, values bit-equal to gguf-py's reader plus
`gguf.quants.dequantize`, PyTorch-order shapes, metadata, zero-copy views, streamed pieces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import migrator
from migrator.core.errors import FormatError
from migrator.formats.gguf.constants import BY_NAME
from migrator.formats.gguf.quants import DEQUANTIZERS, QUANTIZERS
from migrator.run.convert import convert
from tests.support.gguf_files import gguf_reference, random_blocks, write_gguf

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


def split_gguf(folder: Path) -> tuple[list[Path], dict[str, np.ndarray]]:
    """A model gguf-py writes as 3 split files (2 tensors each at most), some tensors Q8_0."""
    folder.mkdir()
    w = gguf.GGUFWriter(str(folder / "m.gguf"), "llama", split_max_tensors=2)
    w.add_name("split")
    w.add_block_count(1)
    rng = np.random.default_rng(7)
    values = {}
    for i in range(5):
        x = rng.standard_normal((2, 64)).astype(np.float32)
        q = i % 2 == 1
        w.add_tensor(f"t{i}", gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0) if q else x,
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0 if q else None)
        values[f"t{i}"] = x
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(folder.glob("*.gguf")), values


def test_split_gguf_is_one_source(tmp_path: Path) -> None:
    files, _ = split_gguf(tmp_path / "split")
    assert [f.name for f in files] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    ref: dict[str, tuple[str, np.ndarray]] = {}
    for f in files:
        ref.update(gguf_reference(f))
    for given in (files[1], tmp_path / "split"):  # any one file of the set, or the folder
        with migrator.open_file(given) as r:
            assert r.format == "gguf" and r.names() == list(ref)
            for t in r.tensors:
                assert r.ggml_type(t) == ref[t.name][0]
                assert same_bits(t.numpy(), ref[t.name][1].astype(np.float32)), t.name
            assert r.metadata["general.name"] == "split" and not any(k.startswith("split.") for k in r.metadata)
    out = tmp_path / "one.gguf"
    convert(files[0], out)
    single = gguf.GGUFReader(str(out))
    assert [t.name for t in single.tensors] == list(ref) and "split.count" not in single.fields
    assert single.fields["general.name"].contents() == "split"
    # quantized blocks copied as stored, as from a single file (bytes: test_gguf_split.py)
    assert [t.tensor_type.name for t in single.tensors] == [ref[n][0] for n in ref]
    assert "Q8_0" in [ref[n][0] for n in ref]


def test_split_gguf_with_a_file_missing(tmp_path: Path) -> None:
    files, _ = split_gguf(tmp_path / "split")
    files[2].unlink()
    with pytest.raises(FormatError, match=r"lacks m-00003-of-00003\.gguf"):
        migrator.open_file(files[0])


def test_inspect_gives_each_tensors_size_as_stored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`inspect` of a quantized GGUF: the size column and `stored_nbytes` are the bytes gguf-py's reader says
    each tensor holds in the file (`n_bytes`), not its dequantized F32 size (`nbytes`, as read)."""
    import json

    from migrator.cli import main

    rng = np.random.default_rng(0)
    path = write_gguf(tmp_path / "q.gguf", {"q8.weight": (rng.standard_normal((64, 32)).astype(np.float32), "Q8_0"),
                                            "q4.weight": (rng.standard_normal((32, 64)).astype(np.float32), "Q4_0"),
                                            "norm.weight": (rng.standard_normal(32).astype(np.float32), "F32")})
    want = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    assert want["q8.weight"] == 64 * 32 // 32 * 34 and want["q4.weight"] == 32 * 64 // 32 * 18
    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = {t["name"]: t for t in doc["tensors"]}
    assert {n: t["stored_nbytes"] for n, t in got.items()} == want
    assert got["q8.weight"]["nbytes"] == 64 * 32 * 4  # as read: F32
    assert doc["totals"]["stored_nbytes"] == sum(want.values())
    assert main(["inspect", str(path)]) == 0
    rows = {line.split()[0]: line.split("]", 1)[1].split() for line in capsys.readouterr().out.splitlines()
            if ".weight" in line}  # after the shape: size (number, unit), offset
    assert rows["q8.weight"][:2] == ["2.1", "KiB"] and rows["q4.weight"][:2] == ["1.1", "KiB"]
    assert rows["norm.weight"][:2] == ["128", "B"]

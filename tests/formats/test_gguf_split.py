"""Split GGUF output (llama.cpp's gguf-split layout: NAME-00001-of-0000N.gguf with split.* key/values),
checked with gguf-py: each file reads, the split keys have the types gguf-py's own split writer gives
them, the files together hold the single-file conversion's tensors byte for byte and its key/values
(in the first file), and no file's data passes the limit unless one tensor does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import migrate_in_process
from tests.support.models import tiny_llama_rope

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

LIMIT = 30_000


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.gguf_models import sentencepiece_model

    folder = tmp_path_factory.mktemp("split") / "hf"
    tiny_llama_rope(vocab_size=300).save_pretrained(folder)
    sentencepiece_model(folder)
    return folder


def _convert(src: Path, dst: str, *options: str) -> None:
    res = migrate_in_process("convert", str(src), dst, *options)
    assert res.returncode == 0, res.stdout + res.stderr


def _fields(r: object) -> dict[str, object]:
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}  # type: ignore[attr-defined]


@pytest.mark.parametrize("quantize", [(), ("--quantize", "Q8_0")], ids=["f32", "q8_0"])
def test_split_files_hold_the_single_file_s_model(hf_folder: Path, tmp_path: Path, quantize: tuple[str, ...]) -> None:
    _convert(hf_folder, str(tmp_path / "one.gguf"), *quantize)
    _convert(hf_folder, str(tmp_path / "split") + "/", "--to", "gguf", "--max-shard-size", f"{LIMIT}B", *quantize)
    files = sorted((tmp_path / "split").iterdir())
    n = len(files)
    assert n > 2
    assert [f.name for f in files] == [f"model-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    one = gguf.GGUFReader(str(tmp_path / "one.gguf"))
    readers = [gguf.GGUFReader(str(f)) for f in files]
    for i, r in enumerate(readers):
        fields = _fields(r)
        assert (fields["split.no"], fields["split.count"], fields["split.tensors.count"]) == (i, n, len(one.tensors))
        if i:  # after the first, only the split keys
            assert set(fields) == {"split.no", "split.count", "split.tensors.count"}
        data = sum(int(t.n_bytes) for t in r.tensors)
        assert data <= LIMIT or len(r.tensors) == 1, (i, data)
    first = _fields(readers[0])
    assert {k: v for k, v in first.items() if not k.startswith("split.")} == _fields(one)
    split_tensors = [t for r in readers for t in r.tensors]
    assert [t.name for t in split_tensors] == [t.name for t in one.tensors]
    for a, b in zip(split_tensors, one.tensors, strict=True):
        assert a.tensor_type == b.tensor_type and list(a.shape) == list(b.shape), a.name
        assert np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes(), a.name


def test_split_key_types_are_gguf_py_s(hf_folder: Path, tmp_path: Path) -> None:
    """gguf-py's GGUFWriter in split mode types split.no/count UINT16 and split.tensors.count INT32 (as
    llama.cpp reads them); ours the same."""
    _convert(hf_folder, str(tmp_path / "split") + "/", "--to", "gguf", "--max-shard-size", f"{LIMIT}B")
    ours = gguf.GGUFReader(str(next((tmp_path / "split").glob("*-00001-of-*.gguf"))))
    writer = gguf.GGUFWriter(str(tmp_path / "ref.gguf"), "llama", split_max_tensors=1)
    for name in ("a", "b"):
        writer.add_tensor(name, np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ref = gguf.GGUFReader(str(next(tmp_path.glob("ref-00001-of-00002.gguf"))))
    for key in ("split.no", "split.count", "split.tensors.count"):
        assert ours.fields[key].types == ref.fields[key].types, key


def test_split_folder_reads_back_as_the_single_file(hf_folder: Path, tmp_path: Path) -> None:
    """migrator's reader of the split folder (already checked against gguf-py) gives the single file's tensors."""
    import migrator

    _convert(hf_folder, str(tmp_path / "one.gguf"))
    _convert(hf_folder, str(tmp_path / "split") + "/", "--to", "gguf", "--max-shard-size", f"{LIMIT}B")
    with migrator.open_file(tmp_path / "split") as split, migrator.open_file(tmp_path / "one.gguf") as one:
        assert split.names() == one.names()
        assert all(np.array_equal(split[n].numpy(), one[n].numpy()) for n in one.names())


def test_one_file_is_still_numbered_and_overwrite_replaces_the_splits(hf_folder: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "split") + "/"
    _convert(hf_folder, out, "--to", "gguf", "--max-shard-size", f"{LIMIT}B")
    res = migrate_in_process("convert", str(hf_folder), out, "--to", "gguf")
    assert res.returncode != 0  # the folder exists
    _convert(hf_folder, out, "--to", "gguf", "--overwrite")  # the old split files are the model's: replaced
    assert sorted(p.name for p in (tmp_path / "split").iterdir()) == ["model-00001-of-00001.gguf"]
    fields = _fields(gguf.GGUFReader(str(tmp_path / "split" / "model-00001-of-00001.gguf")))
    assert (fields["split.no"], fields["split.count"]) == (0, 1)


def test_a_quantized_gguf_is_split_block_for_block(hf_folder: Path, tmp_path: Path) -> None:
    """GGUF -> split GGUF (`--to gguf` on a folder target: not the Hugging Face folder a GGUF source
    otherwise becomes): the same names, types and bytes, quantized blocks copied as stored."""
    _convert(hf_folder, str(tmp_path / "q.gguf"), "--quantize", "Q8_0")
    res = migrate_in_process("convert", str(tmp_path / "q.gguf"), str(tmp_path / "split") + "/", "--to", "gguf",
                             "--max-shard-size", f"{LIMIT}B")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "written in their stored ggml types" in res.stdout + res.stderr
    files = sorted((tmp_path / "split").iterdir())
    assert len(files) > 2 and all(f.suffix == ".gguf" for f in files)  # no config.json: still GGUF
    one = gguf.GGUFReader(str(tmp_path / "q.gguf"))
    split = [t for f in files for t in gguf.GGUFReader(str(f)).tensors]
    assert [(t.name, t.tensor_type) for t in split] == [(t.name, t.tensor_type) for t in one.tensors]
    assert all(np.asarray(a.data).tobytes() == np.asarray(b.data).tobytes() for a, b in zip(split, one.tensors,
                                                                                           strict=True))


@pytest.mark.parametrize("quantize", [(), ("--quantize", "Q8_0")], ids=["f32", "q8_0"])
@pytest.mark.parametrize("named", ["folder", "first", "third"])
def test_split_gguf_to_hf_folder_equals_what_transformers_reads_from_the_single_file(
        hf_folder: Path, tmp_path: Path, quantize: tuple[str, ...], named: str) -> None:
    """A split GGUF made by gguf-py's split writer (from a single file), named by its folder or any of its
    files, becomes a Hugging Face folder whose model equals what transformers reads from the single file
    (transformers reads no split files), with the same config and tokenizer."""
    from tests.support.gguf_files import split_with_gguf_py

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    _convert(hf_folder, str(tmp_path / "one.gguf"), *quantize)
    files = split_with_gguf_py(tmp_path / "one.gguf", tmp_path / "split", max_tensors=5)
    assert len(files) == 5
    src = {"folder": tmp_path / "split", "first": files[0], "third": files[2]}[named]
    _convert(src, str(tmp_path / "back") + "/")
    folder = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "back")
    single = transformers.LlamaForCausalLM.from_pretrained(tmp_path, gguf_file="one.gguf")
    a, b = folder.state_dict(), single.state_dict()
    assert set(a) == set(b)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "rms_norm_eps", "vocab_size", "bos_token_id", "eos_token_id", "tie_word_embeddings"):
        # rms_norm_eps: transformers gives the float32 stored (9.9999997e-06), the config made the decimal (1e-05)
        assert getattr(folder.config, key) == pytest.approx(getattr(single.config, key), rel=1e-6), key
    assert folder.config.rope_parameters["rope_theta"] == single.config.rope_parameters["rope_theta"]


@pytest.mark.parametrize("target", ["single", "split"])
def test_a_split_quantized_source_keeps_its_blocks(hf_folder: Path, tmp_path: Path, target: str) -> None:
    """Split GGUF (gguf-py's split writer) -> GGUF, one file or split again at another size: gguf-py reads
    every tensor with the source's type and bytes (blocks copied as stored, not dequantized and written F32)."""
    from tests.support.gguf_files import split_with_gguf_py

    _convert(hf_folder, str(tmp_path / "q.gguf"), "--quantize", "Q4_K_M")  # rows of 64: Q5_0, Q8_0 ... fallbacks
    source = gguf.GGUFReader(str(tmp_path / "q.gguf")).tensors
    assert len({t.tensor_type.name for t in source} - {"F32"}) >= 2
    files = split_with_gguf_py(tmp_path / "q.gguf", tmp_path / "split", max_tensors=4)
    out = tmp_path / ("out.gguf" if target == "single" else "out")
    res = migrate_in_process("convert", str(files[0] if target == "single" else tmp_path / "split"),
                             str(out) + ("" if target == "single" else "/"), "--to", "gguf",
                             *(() if target == "single" else ("--max-shard-size", f"{LIMIT}B")))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "written in their stored ggml types" in res.stdout + res.stderr
    outputs = [out] if target == "single" else sorted(out.iterdir())
    written = [t for f in outputs for t in gguf.GGUFReader(str(f)).tensors]
    assert [(t.name, t.tensor_type) for t in written] == [(t.name, t.tensor_type) for t in source]
    assert [t.name for a, t in zip(written, source, strict=True)
            if np.asarray(a.data).tobytes() != np.asarray(t.data).tobytes()] == []

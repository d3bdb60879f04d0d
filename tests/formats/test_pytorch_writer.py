"""PyTorch writer: torch.load(weights_only=True) accepts our files with equal values."""

from __future__ import annotations

import io
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migrator.core import dtypes
from migrator.core.errors import PlanError, UnsupportedDTypeError
from migrator.core.scalars import Scalar
from migrator.core.tensor import LazyTensor, from_numpy
from migrator.files.io import open_file, save, to_bytes
from migrator.formats.pytorch_writer import PytorchWriter

torch = pytest.importorskip("torch")

TORCH_DTYPES = [d for d in dtypes.ALL if d.torch_name is not None]
REFUSED = [d for d in dtypes.ALL if d.torch_name is None] + [dtypes.qfloat(b"\xa0")]


def torch_bytes(t: Any) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def random_array(dt: dtypes.DType, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dt.kind is dtypes.Kind.BOOL:
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    raw = rng.integers(0, 256, n * (dt.itemsize or 1), dtype=np.uint8)
    return raw.view(dt.numpy()).reshape(shape)


def lazy(name: str, dt: dtypes.DType, shape: tuple[int, ...], seed: int = 0) -> LazyTensor:
    return from_numpy(name, random_array(dt, shape, seed), dtype=dt)


def check_against_torch(path: Path, tensors: list[LazyTensor]) -> dict[str, Any]:
    loaded = torch.load(path, weights_only=True)
    assert list(loaded) == [t.name for t in tensors]
    for t in tensors:
        ref = loaded[t.name]
        assert str(ref.dtype) == f"torch.{t.dtype.torch_name}", t.name
        assert tuple(ref.shape) == t.shape, t.name
        assert torch_bytes(ref) == bytes(t.data()), t.name
    return loaded


def test_every_dtype_loads_in_torch(tmp_path: Path) -> None:
    tensors = []
    for i, dt in enumerate(TORCH_DTYPES):
        tensors += [lazy(f"{dt.name}.matrix", dt, (3, 7), i), lazy(f"{dt.name}.scalar", dt, (), i),
                    lazy(f"{dt.name}.empty", dt, (2, 0, 3), i)]
    out = save(tensors, tmp_path / "all.pt")
    assert out == str(tmp_path / "all.pt")
    loaded = check_against_torch(tmp_path / "all.pt", tensors)
    mapped = torch.load(tmp_path / "all.pt", weights_only=True, mmap=True)  # needs aligned storages
    assert all(torch_bytes(mapped[k]) == torch_bytes(v) for k, v in loaded.items())


def test_zip_structure(tmp_path: Path) -> None:
    tensors = [lazy("a.weight", dtypes.F32, (5, 3)), lazy("b", dtypes.BF16, (17,), 1)]
    writer = PytorchWriter(tensors)
    path = tmp_path / "s.pt"
    save(tensors, path)
    raw = path.read_bytes()
    assert len(raw) == writer.total_size
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None  # every CRC-32 right
        names = z.namelist()
        assert names == ["archive/data.pkl", "archive/.format_version", "archive/.storage_alignment",
                         "archive/byteorder", "archive/data/0", "archive/data/1", "archive/version"]
        assert z.read("archive/byteorder") == b"little"
        for info in z.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            nlen, xlen = struct.unpack_from("<HH", raw, info.header_offset + 26)
            assert (info.header_offset + 30 + nlen + xlen) % 64 == 0, info.filename
        assert z.read("archive/data.pkl")[:2] == b"\x80\x02"


def test_round_trip_through_our_reader(tmp_path: Path) -> None:
    tensors = [lazy(f"t{i}", dt, (4, 2), i) for i, dt in enumerate(TORCH_DTYPES)]
    path = tmp_path / "r.pt"
    save(tensors, path)
    reader = open_file(path)
    assert reader.names() == [t.name for t in tensors]
    for src, got in zip(tensors, reader.tensors, strict=True):
        assert got.dtype == src.dtype and got.shape == src.shape
        assert bytes(got.data()) == bytes(src.data())
        assert got.span is not None and got.span.offset % 64 == 0
    assert reader.extra()["container"] == "zip" and reader.extra()["pickle_protocol"] == 2


def test_conversion_from_torch_file_keeps_views_and_ties(tmp_path: Path) -> None:
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    src = tmp_path / "src.pt"
    torch.save({"emb": w, "head": w, "wt": w.t(), "half": w[::2], "n": torch.tensor(3)}, src)
    reader = open_file(src)
    out = tmp_path / "out.pt"
    writer = PytorchWriter(reader.tensors)
    assert writer.shared_storages() == [["emb", "head"]]
    save(reader.tensors, out)
    loaded = check_against_torch(out, reader.tensors)
    original = torch.load(src, weights_only=True)
    for k, v in original.items():
        assert torch.equal(loaded[k], v)
    assert loaded["emb"].untyped_storage().data_ptr() == loaded["head"].untyped_storage().data_ptr()
    assert loaded["wt"].is_contiguous()


def test_many_tensors_and_big_memo(tmp_path: Path) -> None:
    tensors = [lazy(f"layers.{i}.w", dtypes.F16, (2,), i) for i in range(1500)]
    save(tensors, tmp_path / "many.pt")
    check_against_torch(tmp_path / "many.pt", tensors)


def test_large_shape_values_and_unicode_names(tmp_path: Path) -> None:
    t = lazy("größe.✓", dtypes.I8, (70000,), 3)
    save([t], tmp_path / "u.pt")
    check_against_torch(tmp_path / "u.pt", [t])


def test_forced_zip64(tmp_path: Path) -> None:
    tensors = [lazy("x", dtypes.F64, (3, 3)), lazy("y", dtypes.U8, (5,), 1)]
    writer = PytorchWriter(tensors, force_zip64=True)
    path = tmp_path / "z64.pt"
    with open(path, "wb") as f:
        writer.write_to(f)
    assert path.stat().st_size == writer.total_size
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
    check_against_torch(path, tensors)
    reader = open_file(path)
    assert [bytes(t.data()) for t in reader.tensors] == [bytes(t.data()) for t in tensors]


def test_in_memory_output(tmp_path: Path) -> None:
    tensors = [lazy("a", dtypes.F32, (2, 2))]
    data = to_bytes(tensors, "pytorch")
    loaded = torch.load(io.BytesIO(data), weights_only=True)
    assert torch_bytes(loaded["a"]) == bytes(tensors[0].data())
    assert open_file(data).names() == ["a"]


def test_computed_tensors_are_written(tmp_path: Path) -> None:
    base = lazy("base", dtypes.F32, (3, 5))
    arr = base.numpy()
    transposed = base.derived(dtype=dtypes.F32, shape=(5, 3),
                              loader=lambda: np.ascontiguousarray(arr.T).tobytes())
    transposed = transposed.renamed("t")
    save([transposed], tmp_path / "c.pt")
    loaded = torch.load(tmp_path / "c.pt", weights_only=True)
    assert np.array_equal(loaded["t"].numpy(), arr.T)


@pytest.mark.parametrize("dt", REFUSED, ids=lambda d: d.display)
def test_refused_dtypes_write_nothing(tmp_path: Path, dt: dtypes.DType) -> None:
    if dt.bits is None or dt.nbytes((4,)) is None:
        bad = LazyTensor("bad", dt, (4,), 4, loader=lambda: bytes(4))
    else:
        bad = LazyTensor("bad", dt, (4,), dt.nbytes((4,)) or 0, loader=lambda: bytes(dt.nbytes((4,)) or 0))
    target = tmp_path / "no.pt"
    with pytest.raises(UnsupportedDTypeError, match="tensor 'bad'"):
        save([lazy("ok", dtypes.F32, (2,)), bad], target)
    assert os.listdir(tmp_path) == []


def test_plan_errors(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="duplicate"):
        PytorchWriter([lazy("a", dtypes.F32, (1,)), lazy("a", dtypes.F32, (2,))])
    wrong = LazyTensor("w", dtypes.F32, (3,), 8, loader=lambda: bytes(8))
    with pytest.raises(PlanError, match="needs 12"):
        PytorchWriter([wrong])


def test_scalars_and_metadata_are_not_carried(tmp_path: Path) -> None:
    tensors = [lazy("a", dtypes.F32, (2,))]
    writer = PytorchWriter(tensors, metadata={"format": "x"}, scalars={"epoch": Scalar("Int", 3)})
    assert writer.dropped == ["format", "epoch"]
    save(tensors, tmp_path / "d.pt", metadata={"format": "x"}, scalars={"epoch": Scalar("Int", 3)})
    assert list(torch.load(tmp_path / "d.pt", weights_only=True)) == ["a"]


def test_load_state_dict_accepts_output(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    src = tmp_path / "m.pt"
    torch.save(model.state_dict(), src)
    out = tmp_path / "m2.pt"
    save(open_file(src).tensors, out)
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    fresh.load_state_dict(torch.load(out, weights_only=True))
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)


class _PipeSink(io.RawIOBase):
    """A sink that cannot seek back (a pipe, a socket): the writer must not need to."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.buf += bytes(b)
        return len(b)


@pytest.mark.parametrize("force_zip64", [False, True])
def test_streamed_computed_tensors_match_torch_seekable_or_not(tmp_path: Path, force_zip64: bool) -> None:
    """Large transposes and casts are streamed (several on the Ahead thread) and their CRCs patched in;
    a sink that cannot seek gets the same bytes the whole-tensor way."""
    from migrator.core import casts

    rng = np.random.default_rng(3)
    arrays = {f"l{i}.weight": rng.standard_normal((300 + i, 700)).astype(np.float32) for i in range(4)}
    arrays["emb"] = rng.standard_normal((2000, 96)).astype(np.float32)
    planned = [casts.transpose2d(from_numpy(n, a)) for n, a in arrays.items() if n != "emb"]
    planned.append(casts.cast(from_numpy("emb", arrays["emb"]), dtypes.BY_NAME["F16"]))
    planned.append(from_numpy("tiny", np.arange(5, dtype=np.int64)))
    writer = PytorchWriter(planned, force_zip64=force_zip64)
    path = tmp_path / "s.pt"
    with open(path, "wb") as f:
        writer.write_to(f)
    assert path.stat().st_size == writer.total_size
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None  # every patched CRC-32 right
    loaded = torch.load(path, weights_only=True)
    for n, a in arrays.items():
        want = torch.from_numpy(a).half() if n == "emb" else torch.from_numpy(a).T
        assert torch.equal(loaded[n], want), n
    pipe = _PipeSink()
    PytorchWriter(planned, force_zip64=force_zip64).write_to(pipe)  # type: ignore[arg-type]
    assert bytes(pipe.buf) == path.read_bytes()


def test_a_computed_tensor_of_the_wrong_length_is_refused(tmp_path: Path) -> None:
    good = from_numpy("good", np.ones((600, 600), np.float32))
    short = LazyTensor("short", dtypes.F32, (600, 600), 600 * 600 * 4, lambda: b"", None, None, "test",
                       lambda: iter([bytes(600 * 600 * 4 - 4)]))
    target = tmp_path / "bad.pt"
    with pytest.raises(Exception, match="produced 1439996 bytes") as err:
        save([good, short], target)
    assert getattr(err.value, "tensor", None) == "short"
    assert not target.exists()

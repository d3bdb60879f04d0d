"""PyTorch reader against torch itself: every dtype, view, container and protocol, compared bitwise."""

from __future__ import annotations

import io
import pickle
import struct
import tarfile
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migrator.core import dtypes
from migrator.core.errors import (
    FormatError,
    LimitExceededError,
    MigratorError,
    TensorNotFoundError,
    UnsafePickleError,
    UnsupportedDTypeError,
)
from migrator.core.scalars import Scalar
from migrator.files.io import open_file
from migrator.formats import safepickle
from migrator.formats.pytorch import PytorchReader
from tests.support.fixtures import fixture_file

torch = pytest.importorskip("torch")

ALL_DTYPES = [
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32",
    "uint64", "bool", "complex64",
]
NO_LEGACY_STORAGE_CLASS = {"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                           "float8_e8m0fnu", "uint16", "uint32", "uint64"}


# ----------------------------------------------------------------------------------------------
# helpers


def torch_bytes(t: Any) -> bytes:
    """A torch tensor's elements in C order as raw little-endian bytes."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def flatten_torch(obj: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten_torch(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten_torch(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def assert_matches_torch(path: Path, *, original: Any = None, **reader_kwargs: Any) -> PytorchReader:
    """Open with migrator and with torch.load; every tensor equal in name, dtype, shape and bits.

    `original` replaces torch.load where torch cannot read its own file back.
    """
    reader = open_file(path, **reader_kwargs)
    assert isinstance(reader, PytorchReader)
    if original is None:
        try:
            original = torch.load(path, weights_only=True)
        except pickle.UnpicklingError:  # torch's weights_only unpickler lacks FRAME (protocol 4+)
            original = torch.load(path, weights_only=False)  # our own test files: trusted
    expected = flatten_torch(original)
    key = reader_kwargs.get("top_level_key")
    if key:
        prefix = key if isinstance(key, str) else ".".join(key)
        expected = {k[len(prefix) + 1 :]: v for k, v in expected.items() if k.startswith(prefix + ".")}
    assert reader.names() == list(expected)
    for t in reader.tensors:
        ref = expected[t.name]
        assert t.dtype.torch_name == str(ref.dtype).removeprefix("torch."), t.name
        assert t.shape == tuple(ref.shape), t.name
        assert t.nbytes == ref.numel() * ref.element_size()
        assert bytes(t.data()) == torch_bytes(ref), t.name
    return reader


def random_tensor(dtype_name: str, shape: tuple[int, ...], seed: int = 0) -> Any:
    """Random bit patterns (NaN payloads, subnormals, infinities included)."""
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = int(np.prod(shape)) if shape else 1
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def save(obj: Any, path: Path, *, fmt: str = "zip", protocol: int = 2) -> Path:
    torch.save(obj, path, pickle_protocol=protocol, _use_new_zipfile_serialization=(fmt == "zip"))
    return path


FORMATS = ["zip", "legacy"]


# ----------------------------------------------------------------------------------------------
# dtypes, shapes, views


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype_name", ALL_DTYPES)
def test_every_dtype(tmp_path: Path, fmt: str, dtype_name: str) -> None:
    sd = {"t": random_tensor(dtype_name, (3, 5)), "s": random_tensor(dtype_name, (), seed=1),
          "e": random_tensor(dtype_name, (0, 4), seed=2)}
    path = save(sd, tmp_path / f"{dtype_name}.pt", fmt=fmt)
    original = None
    if fmt == "legacy" and dtype_name in NO_LEGACY_STORAGE_CLASS:
        with pytest.raises(AttributeError):  # torch 2.x writes these legacy files but cannot load them
            torch.load(path, weights_only=True)
        original = sd
    reader = assert_matches_torch(path, original=original)
    assert reader.extra()["container"] == fmt
    assert reader["t"].dtype == dtypes.BY_TORCH[dtype_name]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickle_protocols(tmp_path: Path, fmt: str, protocol: int) -> None:
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    sd = OrderedDict(w=base, wt=base.t(), p=torch.nn.Parameter(torch.ones(2, 2)), i=torch.tensor(7),
                     nested={"a": [torch.zeros(2), {"b": torch.ones(1, dtype=torch.int16)}]}, epoch=3)
    reader = assert_matches_torch(save(sd, tmp_path / "p.pt", fmt=fmt, protocol=protocol))
    assert reader.extra()["pickle_protocol"] == protocol
    assert reader.scalars == {"epoch": Scalar("Int", 3)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_views_strides_and_offsets(tmp_path: Path, fmt: str) -> None:
    base = random_tensor("float32", (8, 12))
    big = torch.arange(4 * 5 * 6 * 7, dtype=torch.int64).reshape(4, 5, 6, 7)
    sd = {
        "transposed": base.t(),
        "stepped": base[::2, 1::3],
        "offset": base.reshape(-1)[7:30],
        "row": base[3],
        "column": base[:, 5],
        "permuted": big.permute(3, 1, 0, 2),
        "narrow_t": big[1:3, :, 2:5].transpose(0, 2),
        "expanded": torch.tensor([1.5, -2.0]).reshape(2, 1).expand(2, 6),
        "diag": base[:5, :5].diagonal(),
        "bf16_t": random_tensor("bfloat16", (4, 6), seed=3).t(),
        "bool_step": random_tensor("bool", (9,), seed=4)[::3],
        "scalar_view": base[2, 3],
        "empty_view": base[:, 4:4],
    }
    reader = assert_matches_torch(save(sd, tmp_path / "views.pt", fmt=fmt))
    assert reader["offset"].span is not None  # contiguous with an offset: zero-copy
    assert reader["row"].span is not None
    assert reader["transposed"].span is None  # gathered
    assert reader["expanded"].span is None


def test_contiguous_tensor_is_a_view_of_the_file(tmp_path: Path) -> None:
    t = random_tensor("float32", (64, 64))
    path = save({"big": t, "small": t[10:12]}, tmp_path / "v.pt")
    reader = open_file(path)
    big = reader["big"]
    assert big.span is not None and big.span.offset % 64 == 0
    with open(path, "rb") as f:
        f.seek(big.span.offset)
        assert f.read(big.nbytes) == torch_bytes(t)
    small = reader["small"]
    assert small.span is not None and small.span.offset == big.span.offset + 10 * 64 * 4
    data = small.data()
    assert isinstance(data, memoryview) and data.readonly


@pytest.mark.parametrize("fmt", FORMATS)
def test_shared_storages(tmp_path: Path, fmt: str) -> None:
    w = random_tensor("float16", (10, 4))
    base = torch.arange(100, dtype=torch.float32)
    sd = {"embed.weight": w, "head.weight": w, "v1": base[10:20], "v2": base[50:60], "alone": torch.ones(3)}
    reader = assert_matches_torch(save(sd, tmp_path / "tied.pt", fmt=fmt))
    groups = sorted(sorted(g) for g in reader.shared_storages())
    assert groups == [["embed.weight", "head.weight"], ["v1", "v2"]]
    assert reader["v1"].numpy().tolist() == list(range(10, 20))
    assert reader["v2"].numpy().tolist() == list(range(50, 60))


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_tensor_object_under_several_names(tmp_path: Path, fmt: str) -> None:
    """A tensor pickled once and referenced again (memo) reads under each name, whatever kind it is:
    a verbatim row, a strided view, an empty tensor; before and after other kinds, nested or not."""
    row = random_tensor("float32", (4, 3))
    view = random_tensor("int16", (3, 5), seed=1).t()
    empty = torch.zeros(0, 2)
    sd = {"a.row": row, "a.view": view, "a.empty": empty, "b": {"row": row, "view": view, "empty": empty},
          "c": [view, row], "d.row": row}
    reader = assert_matches_torch(save(sd, tmp_path / "again.pt", fmt=fmt))
    assert reader.names() == ["a.row", "a.view", "a.empty", "b.row", "b.view", "b.empty", "c.0", "c.1", "d.row"]
    first = {t.name: t for t in reader.tensors}
    for name, again in (("a.row", ("b.row", "c.1", "d.row")), ("a.view", ("b.view", "c.0")),
                        ("a.empty", ("b.empty",))):
        for other in again:
            assert first[other].loader is first[name].loader and first[other].span is first[name].span
    assert sorted(sorted(g) for g in reader.shared_storages()) == [
        ["a.empty", "b.empty"], ["a.row", "b.row", "c.1", "d.row"], ["a.view", "b.view", "c.0"]]


def test_nested_lists_tuples_and_metadata_attribute(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    sd = model.state_dict()
    assert hasattr(sd, "_metadata")
    ckpt = {"model": sd, "layers": [{"w": torch.ones(2)}, {"w": torch.zeros(2)}], "pair": (torch.eye(2), 5),
            "name": "run-1", "lr": 1e-3, "flags": {"amp": True}, "none": None, "big": 2**70}
    reader = assert_matches_torch(save(ckpt, tmp_path / "n.pt"))
    assert "model.1.num_batches_tracked" in reader.names()
    assert "layers.1.w" in reader and "pair.0" in reader
    assert not any("_metadata" in n for n in reader.names())
    assert reader.metadata == {"name": "run-1"}
    assert reader.scalars == {"pair.1": Scalar("Int", 5), "lr": Scalar("Float", 1e-3),
                              "flags.amp": Scalar("Bool", True)}
    assert "none" in reader.extra()["ignored"] and "big" in reader.extra()["ignored"]


def test_top_level_key(tmp_path: Path) -> None:
    ckpt = {"model": {"state_dict": {"fc.weight": torch.ones(2, 2)}, "cfg.name": {"x": torch.zeros(1)}},
            "epoch": 1}
    path = save(ckpt, tmp_path / "k.pt")
    assert_matches_torch(path, top_level_key="model.state_dict")
    assert open_file(path, top_level_key=["model", "state_dict"]).names() == ["fc.weight"]
    assert open_file(path, top_level_key="model.cfg.name").names() == ["x"]  # keys may contain dots
    assert open_file(path, top_level_key="model").names() == ["state_dict.fc.weight", "cfg.name.x"]
    with pytest.raises(TensorNotFoundError, match=r"'nope'.*available keys: 'model', 'epoch'"):
        open_file(path, top_level_key="nope")
    with pytest.raises(TensorNotFoundError, match=r"'state_dic'.*'state_dict'"):
        open_file(path, top_level_key="model.state_dic")
    with pytest.raises(FormatError, match="is a tensor"):
        open_file(path, top_level_key="model.state_dict.fc.weight")


def test_unsupported_dtypes_only_when_selected(tmp_path: Path) -> None:
    q = torch.quantize_per_tensor(torch.ones(4), 0.5, 0, torch.qint8)
    ckpt = {"ok": {"w": torch.ones(2)}, "bad": {"c": torch.zeros(2, dtype=torch.complex128), "q": q}}
    path = save(ckpt, tmp_path / "u.pt")
    with pytest.raises(UnsupportedDTypeError, match=r"tensor 'bad.c'.*complex128"):
        open_file(path)
    with pytest.raises(UnsupportedDTypeError, match=r"tensor 'c'.*complex128"):
        open_file(path, top_level_key="bad")
    with pytest.raises(UnsupportedDTypeError, match=r"tensor 'q'.*quantized"):
        open_file(save({"q": q}, tmp_path / "q.pt"))
    assert open_file(path, top_level_key="ok").names() == ["w"]


def test_big_endian_zip_is_byte_swapped(tmp_path: Path) -> None:
    sd = {"f": random_tensor("float32", (3, 4)), "h": random_tensor("bfloat16", (5,), seed=1),
          "c": random_tensor("complex64", (2,), seed=2), "i": random_tensor("int64", (2, 2), seed=3).t(),
          "b": random_tensor("uint8", (4,), seed=4)}
    little = save(sd, tmp_path / "le.pt")
    big = tmp_path / "be.pt"
    with zipfile.ZipFile(little) as zin, zipfile.ZipFile(big, "w", zipfile.ZIP_STORED) as zout:
        data_pkl = next(n for n in zin.namelist() if n.endswith("data.pkl"))
        units: dict[str, int] = {}
        for pid_units in _storage_units(zin.read(data_pkl)):
            units.update(pid_units)
        for info in zin.infolist():
            payload = zin.read(info)
            if info.filename.endswith("/byteorder"):
                payload = b"big"
            key = info.filename.rpartition("/data/")[2] if "/data/" in info.filename else None
            if key is not None and units.get(key, 1) > 1:
                payload = np.frombuffer(payload, dtype=f"<u{units[key]}").byteswap().tobytes()
            zout.writestr(info.filename, payload)
    reader = assert_matches_torch(big)
    assert all(bytes(t.data()) == torch_bytes(sd[t.name]) for t in reader.tensors)
    assert reader.extra()["byteorder"] == "big"
    assert all(t.span is None for t in reader.tensors if t.dtype.itemsize and t.dtype.itemsize > 1)


def _storage_units(data_pkl: bytes) -> list[dict[str, int]]:
    """Storage key -> byte-swap unit (complex swaps each half) from a torch data.pkl."""
    out: list[dict[str, int]] = []

    def pid(p: tuple) -> Any:  # type: ignore[type-arg]
        dtype = p[1].dtype
        size = safepickle.ELEMENT_SIZES[dtype]
        out.append({str(p[2]): size // 2 if dtype.startswith("complex") else size})
        return safepickle.StorageRef(str(p[2]), p[1].name, dtype, p[4], "cpu")

    safepickle.load(data_pkl, persistent_load=pid)
    return out


# ----------------------------------------------------------------------------------------------
# containers: zip details, legacy, tar


def test_in_memory_source_and_opaque_references(tmp_path: Path) -> None:
    path = save({"w": torch.ones(2, 3), "kind": torch.nn.Linear, "dtype": torch.float16}, tmp_path / "m.pt")
    reader = open_file(path.read_bytes(), format="pytorch")
    assert reader.names() == ["w"] and reader.path is None
    assert bytes(reader["w"].data()) == torch_bytes(torch.ones(2, 3))
    assert reader.extra()["opaque_objects"] == ["torch.nn.modules.linear.Linear"]
    assert set(reader.extra()["ignored"]) == {"kind", "dtype"}


def test_zip_any_root_name_and_extra(tmp_path: Path) -> None:
    path = save({"x": torch.ones(2)}, tmp_path / "weird name.pt")
    reader = assert_matches_torch(path)
    extra = reader.extra()
    assert extra["container"] == "zip" and extra["archive_root"] == "weird name"
    assert extra["byteorder"] == "little" and extra["pickle_protocol"] == 2
    assert extra["opaque_objects"] == []
    renamed = tmp_path / "renamed.pt"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(renamed, "w") as zout:
        for info in zin.infolist():
            zout.writestr("other/" + info.filename.split("/", 1)[1], zin.read(info))
    assert open_file(renamed).names() == ["x"]


def test_legacy_counts_are_read_not_inferred(tmp_path: Path) -> None:
    base = torch.arange(100, dtype=torch.float32)
    path = save({"a": base[10:20], "b": torch.ones(3, dtype=torch.float64), "c": base[95:]}, tmp_path / "l.pt",
                fmt="legacy")
    reader = assert_matches_torch(path)
    assert reader.extra()["data_end"] == path.stat().st_size
    # corrupt the first storage's element count: the reader must notice, not guess
    raw = bytearray(path.read_bytes())
    first = reader["a"].span.offset - 10 * 4 - 8  # type: ignore[union-attr]
    assert struct.unpack_from("<q", raw, first)[0] == 100
    struct.pack_into("<q", raw, first, 10**15)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="needs bytes"):
        open_file(bad)


def test_legacy_from_a_big_endian_machine_is_refused(tmp_path: Path) -> None:
    raw = save({"a": torch.ones(2)}, tmp_path / "l.pt", fmt="legacy").read_bytes()
    assert raw.count(b"little_endianq\x02\x88") == 1
    bad = tmp_path / "be.pt"
    bad.write_bytes(raw.replace(b"little_endianq\x02\x88", b"little_endianq\x02\x89"))
    with pytest.raises(FormatError, match="big-endian"):
        open_file(bad)


def _pickle_with_pids(obj: Any, pid: Any) -> bytes:
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=2)
    p.persistent_id = pid  # type: ignore[method-assign]
    p.dump(obj)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


class _TensorMark:
    def __init__(self, key: int) -> None:
        self.key = key


def test_real_old_tar_layout(tmp_path: Path) -> None:
    """Built as torch <= 0.3's tar `_save` wrote it: tensors table + storages with views."""
    root_a = np.arange(24, dtype=np.float32)
    root_b = np.array([7, -8, 9], dtype=np.int64)
    storages = [(1001, torch.FloatStorage, root_a), (1002, torch.LongStorage, root_b)]
    views = [(2001, 1001, 4, 12)]  # storage 2001 = elements 4..15 of storage 1001
    # (key, storage, size, stride, offset)
    tensors = [(11, 1001, (4, 6), (6, 1), 0), (12, 1001, (6, 4), (1, 6), 0), (13, 2001, (3, 2), (2, 1), 1),
               (14, 1002, (3,), (1,), 0), (15, 1001, (2, 3), (1, 2), 5)]
    obj = {"a": _TensorMark(11), "a_t": _TensorMark(12), "view": _TensorMark(13),
           "sub": {"longs": _TensorMark(14)}, "strided": _TensorMark(15), "epoch": 9}
    sys_info = pickle.dumps({"protocol_version": 1001, "little_endian": True,
                             "type_sizes": {"short": 2, "int": 4, "long": 8}}, protocol=2)
    main = _pickle_with_pids(obj, lambda o: str(o.key) if isinstance(o, _TensorMark) else None)
    tbl = pickle.dumps(len(tensors), protocol=2)
    for key, sid, size, stride, off in tensors:
        tbl += pickle.dumps((key, sid, torch.FloatTensor), protocol=2)
        tbl += struct.pack("<i", len(size)) + b"\0" * 4
        tbl += struct.pack(f"<{len(size)}q", *size) + struct.pack(f"<{len(size)}q", *stride)
        tbl += struct.pack("<q", off)
    st = pickle.dumps(len(storages), protocol=2)
    for key, cls, arr in storages:
        st += pickle.dumps((key, "cpu", cls), protocol=2) + struct.pack("<q", arr.size) + arr.tobytes()
    st += pickle.dumps(views, protocol=2)
    path = tmp_path / "old.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("sys_info", sys_info), ("pickle", main), ("tensors", tbl), ("storages", st)):
            _add(tar, name, data)
    expected = flatten_torch(torch.load(path, weights_only=False))  # torch still reads these (unsafely)
    reader = open_file(path)
    assert reader.extra()["container"] == "tar"
    assert reader.names() == list(expected)
    for t in reader.tensors:
        assert bytes(t.data()) == torch_bytes(expected[t.name]), t.name
    assert reader["view"].numpy().tolist() == [[5, 6], [7, 8], [9, 10]]
    assert reader.scalars == {"epoch": Scalar("Int", 9)}


class _Storage:
    def __init__(self, key: str, cls: Any, numel: int) -> None:
        self.key, self.cls, self.numel = key, cls, numel


class _Rebuild:
    def __init__(self, storage: _Storage, offset: int, size: tuple, stride: tuple) -> None:  # type: ignore[type-arg]
        self.args = (storage, offset, size, stride, False, OrderedDict())

    def __reduce__(self) -> Any:
        return torch._utils._rebuild_tensor_v2, self.args


def test_burn_synthetic_tar_layout(tmp_path: Path) -> None:
    """Burn's own fixtures: the main pickle rebuilds tensors from storage persistent ids."""
    w = np.arange(1, 13, dtype=np.float32)
    b = np.array([1.5, 2.5], dtype=np.float64)
    sw, sb = _Storage("0", torch.FloatStorage, 12), _Storage("1", torch.DoubleStorage, 2)
    obj = {"weight": _Rebuild(sw, 0, (3, 4), (4, 1)), "bias": _Rebuild(sb, 0, (2,), (1,)),
           "wt": _Rebuild(sw, 0, (4, 3), (1, 4))}
    main = _pickle_with_pids(
        obj, lambda o: ("storage", o.cls, o.key, "cpu", o.numel) if isinstance(o, _Storage) else None)
    st = pickle.dumps(2, protocol=2)
    for key, cls, arr in (("0", torch.FloatStorage, w), ("1", torch.DoubleStorage, b)):
        st += pickle.dumps((key, "cpu", cls), protocol=2) + struct.pack("<q", arr.size) + arr.tobytes()
    path = tmp_path / "burn.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        _add(tar, "./sys_info", pickle.dumps({"little_endian": True}, protocol=2))
        _add(tar, "./pickle", main)
        _add(tar, "./storages", st)
    reader = open_file(path)
    assert reader.names() == ["weight", "bias", "wt"]
    assert reader["weight"].numpy().tolist() == w.reshape(3, 4).tolist()
    assert reader["wt"].numpy().tolist() == w.reshape(3, 4).T.tolist()
    assert reader["bias"].numpy().tolist() == [1.5, 2.5]
    assert reader.shared_storages() == [["weight", "wt"]]


# ----------------------------------------------------------------------------------------------
# errors


def test_plain_pickles_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "plain.pt"
    p.write_bytes(pickle.dumps({"a": 1, "b": [1, 2]}, protocol=2))
    with pytest.raises(FormatError, match="plain pickle without tensor data"):
        open_file(p)
    p.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    with pytest.raises(FormatError, match="plain pickle"):
        open_file(p)
    p.write_bytes(_pickle_with_pids({"a": _Storage("0", torch.FloatStorage, 1)},
                                    lambda o: ("storage", o.cls, o.key, "cpu", 1)
                                    if isinstance(o, _Storage) else None))
    with pytest.raises(FormatError, match="no data section"):
        open_file(p)


def test_whole_model_pickle(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(2, 3), path)
    with pytest.raises(safepickle.WholeModelPickleError, match=r"state_dict\(\)") as e:
        open_file(path)
    assert isinstance(e.value, UnsafePickleError) and "torch.nn.modules.linear.Linear" in str(e.value)
    torch.save(torch.nn.Linear(2, 3), path, _use_new_zipfile_serialization=False)
    with pytest.raises(UnsafePickleError, match=r"state_dict\(\)"):
        open_file(path)


def test_single_tensor_root(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="single tensor"):
        open_file(save(torch.ones(2), tmp_path / "t.pt"))


def test_compressed_member_is_refused_before_inflating(tmp_path: Path) -> None:
    src = save({"x": torch.zeros(1 << 16)}, tmp_path / "z.pt")
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bomb, "w") as zout:
        for info in zin.infolist():
            comp = zipfile.ZIP_DEFLATED if "/data/" in info.filename else zipfile.ZIP_STORED
            zout.writestr(info.filename, zin.read(info), compress_type=comp)
    assert bomb.stat().st_size < 4096
    with pytest.raises(FormatError, match="compressed"):
        open_file(bomb)


def test_corrupt_pickle_fails_its_crc(tmp_path: Path) -> None:
    raw = save({"x": torch.zeros(3)}, tmp_path / "z.pt").read_bytes()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(raw.replace(b"storage", b"storagf", 1))
    with pytest.raises(FormatError, match="CRC-32"):
        open_file(bad)


def test_compressed_pickle_is_refused(tmp_path: Path) -> None:
    src = save({"x": torch.zeros(3)}, tmp_path / "z.pt")
    bad = tmp_path / "bad.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            comp = zipfile.ZIP_DEFLATED if info.filename.endswith("data.pkl") else zipfile.ZIP_STORED
            zout.writestr(info.filename, zin.read(info), compress_type=comp)
    with pytest.raises(FormatError, match="compressed"):
        open_file(bad)


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.9, 0.999])
def test_truncated_zip(tmp_path: Path, cut: float) -> None:
    src = save({"x": torch.ones(1000), "y": torch.ones(10)}, tmp_path / "z.pt").read_bytes()
    bad = tmp_path / "cut.pt"
    bad.write_bytes(src[: int(len(src) * cut)])
    with pytest.raises(MigratorError):
        open_file(bad)


def _patch_central_size(raw: bytearray, member_suffix: str, new_size: int) -> None:
    i = raw.find(b"PK\x01\x02")
    while i >= 0:
        nlen = struct.unpack_from("<H", raw, i + 28)[0]
        name = raw[i + 46 : i + 46 + nlen].decode()
        if name.endswith(member_suffix):
            struct.pack_into("<II", raw, i + 20, new_size, new_size)
            return
        i = raw.find(b"PK\x01\x02", i + 4)
    raise AssertionError(member_suffix)


def test_huge_declared_sizes_fail_before_allocation(tmp_path: Path) -> None:
    src = save({"x": torch.ones(8)}, tmp_path / "z.pt")
    raw = bytearray(src.read_bytes())
    _patch_central_size(raw, "data.pkl", 0xFFFF_FFF0)
    bad = tmp_path / "huge.pt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(FormatError):
        open_file(bad)
    raw = bytearray(src.read_bytes())
    _patch_central_size(raw, "data/0", 1 << 31)
    bad.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=r"past|outside|needs bytes"):
        open_file(bad)


def test_tensor_beyond_its_storage(tmp_path: Path) -> None:
    path = save({"x": torch.ones(4)}, tmp_path / "z.pt")
    bad = tmp_path / "bad.pt"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("data/0"):
                data = data[:8]  # storage shrinks from 4 to 2 floats
            zout.writestr(info.filename, data)
    with pytest.raises(FormatError, match=r"tensor 'x'.*declares 16 bytes but the file holds 8"):
        open_file(bad)


def test_strides_past_storage_are_refused(tmp_path: Path) -> None:
    sd = {"x": torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, ::2]}
    path = save(sd, tmp_path / "s.pt")
    with zipfile.ZipFile(path) as z:
        data_pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    # stride tuple (4, 2) -> (40, 2): element 81 of a 12-element storage
    assert b"K\x04K\x02\x86" in data_pkl
    patched = data_pkl.replace(b"K\x04K\x02\x86", b"K(K\x02\x86")
    bad = tmp_path / "bad.pt"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, patched if info.filename.endswith("data.pkl") else zin.read(info))
    with pytest.raises(FormatError, match=r"tensor 'x'.*reach element 82"):
        open_file(bad)


def zip_with_pickle(path: Path, data_pkl: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/version", "3\n")
    return path


def test_hostile_data_pkl_in_a_zip(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    payload = b"cposix\nsystem\n(S'touch " + str(sentinel).encode() + b"'\ntR."
    with pytest.raises(UnsafePickleError, match=r"posix\.system"):
        open_file(zip_with_pickle(tmp_path / "evil.pt", payload))
    assert not sentinel.exists()


def test_torchscript_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ts.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    with pytest.raises(FormatError, match="TorchScript"):
        open_file(path)


def test_limits_on_flattening(tmp_path: Path) -> None:
    inner: Any = [torch.ones(1)]
    for _ in range(25):  # 2**25 paths through shared references
        inner = [inner, inner]
    with pytest.raises(LimitExceededError, match="memo bomb"):
        open_file(save({"x": inner}, tmp_path / "bomb.pt"))
    deep = b"\x80\x02}X\x01\x00\x00\x00x" + b"]" * 1500 + b"a" * 1499 + b"s."  # torch.save would recurse
    with pytest.raises(LimitExceededError, match="nested more than"):
        open_file(zip_with_pickle(tmp_path / "deep.pt", deep))


def test_cycles_are_refused(tmp_path: Path) -> None:
    loop: list[Any] = [torch.ones(1)]
    loop.append(loop)
    with pytest.raises(FormatError, match="cyclic"):
        open_file(save({"x": loop}, tmp_path / "cycle.pt"))


# ----------------------------------------------------------------------------------------------
# shared reference fixtures


def test_fixtures_match_torch() -> None:
    folder = fixture_file("pytorch")
    files = sorted(p for p in folder.glob("*.pt") if p.name != "broken.pt")
    assert len(files) > 30
    for path in files:
        assert_matches_torch(path)


def test_fixture_broken() -> None:
    with pytest.raises(FormatError, match=r"(?i)pickle") as e:
        open_file(fixture_file("pytorch", "broken.pt"))
    assert "broken.pt" in str(e.value)


def test_fixture_checkpoint_scalars() -> None:
    reader = open_file(fixture_file("pytorch", "checkpoint.pt"))
    assert reader.scalars["epoch"] == Scalar("Int", 42)
    assert reader.scalars["loss"] == Scalar("Float", 0.123)
    assert "optimizer_state_dict.state.0.momentum_buffer" in reader.names()
    inner = open_file(fixture_file("pytorch", "checkpoint.pt"), top_level_key="model_state_dict")
    assert inner.names() == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def test_fixture_top_level_key() -> None:
    path = fixture_file("pytorch", "top_level_key.pt")
    reader = assert_matches_torch(path, top_level_key="my_state_dict")
    assert reader.names() == ["conv1.weight", "conv1.bias"]
    with pytest.raises(TensorNotFoundError, match="my_state_dict"):
        open_file(path, top_level_key="model_state_dict")


def test_fixture_simple_legacy() -> None:
    reader = assert_matches_torch(fixture_file("pytorch", "simple_legacy.pt"))
    assert reader.extra()["container"] == "legacy"
    assert reader.names() == ["weight", "bias", "running_mean"]
    assert reader["weight"].shape == (2, 3)


def test_fixture_weights_with_config() -> None:
    reader = open_file(fixture_file("pytorch", "weights_with_config.pt"))
    assert reader.metadata["my_config.some_str"] == "hello"
    assert reader.metadata["my_config.some_list_str.1"] == "world"
    assert reader.scalars["my_config.some_bool"] == Scalar("Bool", True)
    assert reader.scalars["my_config.some_list_float.2"] == Scalar("Float", 0.3)


# ----------------------------------------------------------------------------------------------
# the compact zip directory (numbered storages as arrays) against the general one


def _state_dict_for_layouts() -> dict[str, Any]:
    """Tied weights, views at offsets, a transposed view, an empty tensor and 30 plain tensors."""
    w = random_tensor("float16", (10, 4))
    base = torch.arange(100, dtype=torch.float32)
    sd: dict[str, Any] = {"embed.weight": w, "head.weight": w, "v1": base[10:20], "v2": base[50:60],
                          "t": random_tensor("float32", (3, 5), seed=1).t(), "empty": torch.zeros(0, 3)}
    for i in range(30):
        sd[f"layer.{i}.w"] = random_tensor("bfloat16" if i % 2 else "int64", (i % 4 + 1, 3), seed=i + 2)
    return sd


def _rezip(src: Path, dst: Path, rename: Any, *, order: Any = None, compress: Any = ()) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        infos = zin.infolist()
        for info in (order(infos) if order else infos):
            method = zipfile.ZIP_DEFLATED if info.filename.split("/")[-1] in compress else zipfile.ZIP_STORED
            zout.writestr(rename(info.filename), zin.read(info), compress_type=method)
    return dst


def _snapshot(reader: Any) -> list[tuple[Any, ...]]:
    return [(t.name, t.dtype, t.shape, t.nbytes, bytes(t.data()), t.span is None, t.origin == reader.label,
             t.param_id) for t in reader.tensors] + [sorted(sorted(g) for g in reader.shared_storages())]


def test_zip_directory_layouts_read_the_same(tmp_path: Path) -> None:
    sd = _state_dict_for_layouts()
    path = save(sd, tmp_path / "ref.pt")
    reference = assert_matches_torch(path, original=sd)
    expected = _snapshot(reference)
    assert expected[-1] == [["embed.weight", "head.weight"], ["v1", "v2"]]
    tail = lambda n: n.split("/", 1)[1]  # noqa: E731
    variants = {
        # storages in reverse file order (headers not sorted by index)
        "reversed": dict(rename=lambda n: n, order=lambda infos: infos[:1] + infos[1:][::-1]),
        "no root": dict(rename=tail),
        "nested root": dict(rename=lambda n: "a/b/" + tail(n)),  # general directory entries
    }
    for label, kw in variants.items():
        out = _rezip(path, tmp_path / f"{label}.pt", **kw)
        reader = open_file(out)
        assert _snapshot(reader) == expected, label
        for t in reader.tensors:
            if t.span is not None:
                assert (t.span.offset, t.span.length) == (t.loader.offset, t.loader.length)
                with open(out, "rb") as f:
                    f.seek(t.span.offset)
                    assert f.read(t.span.length) == bytes(t.data()), (label, t.name)


def test_zip_directory_odd_members(tmp_path: Path) -> None:
    sd = _state_dict_for_layouts()
    path = save(sd, tmp_path / "ref.pt")
    # a numbered storage that is compressed is refused by name, when the open locates it
    storage = max(n.rsplit("/", 1)[1] for n in zipfile.ZipFile(path).namelist() if "/data/" in n)
    bad = _rezip(path, tmp_path / "deflated.pt", rename=lambda n: n, compress=(storage,))
    with pytest.raises(FormatError, match=rf"data/{storage} is compressed"):
        open_file(bad)
    # a numbered storage listed twice
    with zipfile.ZipFile(path) as zin:
        infos = zin.infolist()
        dup = next(i for i in infos if i.filename.endswith("/data/0"))
        twice = tmp_path / "twice.pt"
        with pytest.warns(UserWarning), zipfile.ZipFile(twice, "w") as zout:
            for info in [*infos, dup]:
                zout.writestr(info.filename, zin.read(info))
    with pytest.raises(FormatError, match=r"lists member .*data/0 twice"):
        open_file(twice)
    # a missing storage
    missing = _rezip(path, tmp_path / "missing.pt", rename=lambda n: n.replace("/data/0", "/data/x0"))
    with pytest.raises(FormatError, match="storage '0' is missing"):
        open_file(missing)
    # storage numbers beyond the entry count and with leading zeros stay general entries (unreferenced)
    extra = _rezip(path, tmp_path / "extra.pt", rename=lambda n: n)
    with zipfile.ZipFile(extra, "a") as z:
        z.writestr("archive/data/999999", b"x")
        z.writestr("archive/data/01", b"y")
    assert _snapshot(open_file(extra))[0][:5] == _snapshot(open_file(path))[0][:5]


def test_tensors_of_one_layout_share_their_shape(tmp_path: Path) -> None:
    """Shapes are shared per (dtype, shape, stride): values still equal torch's for every tensor."""
    m = random_tensor("float32", (3, 2), seed=5)
    sd = {"a": random_tensor("float32", (2, 3)), "b": random_tensor("float32", (2, 3), seed=1), "t": m.t(),
          "c": random_tensor("float16", (2, 3), seed=2), "d": random_tensor("float32", (3, 2), seed=3),
          "e": random_tensor("float32", (6,), seed=4)}
    for fmt in FORMATS:
        reader = assert_matches_torch(save(sd, tmp_path / f"shapes-{fmt}.pt", fmt=fmt))
        assert reader["a"].shape is reader["b"].shape
        assert reader["t"].shape == (2, 3) and reader["c"].shape == (2, 3) and reader["d"].shape == (3, 2)

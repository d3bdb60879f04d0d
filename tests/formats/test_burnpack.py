"""Burnpack: golden bytes as Burn writes them, its reader's rules and its writer's."""

from __future__ import annotations

import struct
from pathlib import Path

import cbor2
import ml_dtypes
import numpy as np
import pytest

from migrator import from_numpy, open_file, save, to_bytes
from migrator.core import dtypes
from migrator.core.errors import (
    FormatError,
    LimitExceededError,
    MigratorError,
    OutputError,
    PlanError,
    TensorBytesSizeMismatchError,
    TensorNotFoundError,
    UnsupportedDTypeError,
)
from migrator.core.scalars import Scalar
from migrator.core.tensor import LazyTensor
from migrator.formats import burnpack, cbor
from migrator.formats.burnpack import BurnpackWriter

W = np.array([[1, 2], [3, 4]], dtype=np.float32)


def header(meta_len: int, magic: bytes = b"NRUB", version: int = 1) -> bytes:
    return magic + struct.pack("<HI", version, meta_len)


def pack(meta: object, data: bytes = b"", *, raw_meta: bytes | None = None) -> bytes:
    blob = raw_meta if raw_meta is not None else cbor.encode(meta)
    body = header(len(blob)) + blob
    return body + bytes(burnpack.align(len(body)) - len(body)) + data


def desc(dtype: object = "F32", shape: list[int] | None = None, offsets: list[int] | None = None) -> dict:
    return {"dtype": dtype, "shape": shape if shape is not None else [2, 2], "data_offsets": offsets or [0, 16]}


# ------------------------------------------------------------------------------------ golden bytes


def test_example_a_exact_bytes() -> None:
    out = to_bytes([from_numpy("weight", W, param_id=42)], "burnpack")
    expected_cbor = bytes.fromhex(
        "a1 67 74656e736f7273 a1 66 776569676874 a4 65 6474797065 63 463332 65 7368617065 82 02 02"
        " 6c 646174615f6f666673657473 82 00 10 68 706172616d5f6964 18 2a".replace(" ", ""))
    assert out[:10] == bytes.fromhex("4e 52 55 42 01 00 40 00 00 00".replace(" ", ""))
    assert out[10:74] == expected_cbor
    assert out[74:256] == bytes(182)
    assert out[256:] == bytes.fromhex("0000803f000000400000404000008040")
    assert len(out) == 272


def test_example_a_without_param_id_drops_eleven_bytes() -> None:
    out = to_bytes([from_numpy("weight", W)], "burnpack")
    assert struct.unpack("<I", out[6:10])[0] == 64 - 11
    assert out[10 + 17] == 0xA3  # descriptor map head


def test_example_b_metadata_and_scalars() -> None:
    scalars = {"step": Scalar("UInt", 42), "offset": Scalar("Int", -3), "lr": Scalar("Float", 0.001),
               "half": Scalar("Float", 0.5), "flag": Scalar("Bool", True)}
    out = to_bytes([from_numpy("weight", W)], "burnpack", metadata={"format": "burnpack"}, scalars=scalars)
    meta_len = struct.unpack("<I", out[6:10])[0]
    blob = out[10 : 10 + meta_len]
    assert meta_len == 160
    assert blob.startswith(b"\xa3\x67tensors")
    tail = (b"\x68metadata\xa1\x66format\x68burnpack\x67scalars\xa5\x64flag\xa1\x64Bool\xf5"
            b"\x64half\xa1\x65Float\xf9\x38\x00\x62lr\xa1\x65Float\xfb" + bytes.fromhex("3f50624dd2f1a9fc")
            + b"\x66offset\xa1\x63Int\x22\x64step\xa1\x64UInt\x18\x2a")
    assert blob.endswith(tail)
    assert len(out) == 256 + 16
    r = open_file(out)
    assert r.scalars == scalars and r.metadata == {"format": "burnpack"}


def test_example_c_empty_pack_is_256_bytes() -> None:
    out = to_bytes([], "burnpack")
    assert len(out) == 256
    assert out[10:20] == b"\xa1\x67tensors\xa0"
    assert out[20:] == bytes(236)
    assert open_file(out).tensors == []


@pytest.mark.parametrize(("value", "encoded"), [
    (float("nan"), "f97e00"), (float("inf"), "f97c00"), (0.5, "f93800"), (1e10, "fa501502f9"),
    (0.001, "fb3f50624dd2f1a9fc"), (-0.0, "f98000"), (float("-inf"), "f9fc00"), (1.0 / 3.0, "fb3fd5555555555555"),
])
def test_shortest_exact_floats(value: float, encoded: str) -> None:
    assert cbor.encode_float(value).hex() == encoded


@pytest.mark.parametrize("n", [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1])
def test_shortest_ints_agree_with_cbor2(n: int) -> None:
    assert cbor.encode(n) == cbor2.dumps(n)
    assert cbor.encode(-n - 1) == cbor2.dumps(-n - 1)
    assert cbor.decode(cbor.encode(n)) == n


def test_cbor2_reads_our_metadata() -> None:
    out = to_bytes([from_numpy("b", W), from_numpy("a", W, param_id=7)], "burnpack", metadata={"z": "1", "a": "2"})
    meta = cbor2.loads(out[10 : 10 + struct.unpack("<I", out[6:10])[0]])
    assert list(meta["tensors"]) == ["a", "b"]
    assert list(meta["metadata"]) == ["a", "z"]
    assert meta["tensors"]["a"] == {"dtype": "F32", "shape": [2, 2], "data_offsets": [256, 272], "param_id": 7}
    assert meta["tensors"]["b"]["data_offsets"] == [0, 16]


# ------------------------------------------------------------------------------------ layout


@pytest.mark.parametrize("target_meta_len", [0, 1, 10, 245, 246, 247, 4096])
def test_data_start_alignment(target_meta_len: int) -> None:
    d = burnpack.align(10 + target_meta_len)
    assert d % 256 == 0 and 10 + target_meta_len <= d < 10 + target_meta_len + 256


def test_every_start_is_aligned_and_data_order_kept() -> None:
    ts = [from_numpy(n, np.arange(k, dtype=np.float32)) for n, k in (("zebra", 3), ("alpha", 1), ("mango", 2))]
    out = to_bytes(ts, "burnpack")
    r = open_file(out)
    assert r.names() == ["zebra", "alpha", "mango"]  # data order, not key order
    meta = cbor2.loads(out[10 : 10 + struct.unpack("<I", out[6:10])[0]])
    assert list(meta["tensors"]) == ["alpha", "mango", "zebra"]
    starts = [meta["tensors"][n]["data_offsets"][0] for n in ("zebra", "alpha", "mango")]
    assert starts == [0, 256, 512]
    assert len(out) == r.extra()["data_start"] + 512 + 8  # no trailing padding
    for t, (_, k) in zip(r.tensors, (("zebra", 3), ("alpha", 1), ("mango", 2)), strict=True):
        np.testing.assert_array_equal(t.numpy(), np.arange(k, dtype=np.float32))


def test_zero_length_last_tensor_pads_to_its_start() -> None:
    out = to_bytes([from_numpy("a", np.ones(3, np.float32)), from_numpy("e", np.zeros(0, np.float32))], "burnpack")
    r = open_file(out)
    assert len(out) == r.extra()["data_start"] + 256
    assert r["e"].shape == (0,) and r["e"].numpy().size == 0


def test_large_u8_pattern_round_trips() -> None:
    data = (np.arange(8 * 1024 * 1024 + 4096) % 251).astype(np.uint8)
    r = open_file(to_bytes([from_numpy("big", data)], "burnpack"))
    np.testing.assert_array_equal(r["big"].numpy(), data)


# ------------------------------------------------------------------------------------ dtypes


ROUND_TRIP = [
    (dtypes.F64, np.array([1.5, -2.25, np.inf], np.float64)),
    (dtypes.F32, np.array([1.0, np.nan, -0.0], np.float32)),
    (dtypes.F16, np.array([1.5, 65504, -0.0], np.float16)),
    (dtypes.BF16, np.array([1.5, -2.5, 3.5], ml_dtypes.bfloat16)),
    (dtypes.I64, np.array([-(2**63), 0, 2**63 - 1], np.int64)),
    (dtypes.I32, np.array([10, 20, -30], np.int32)),
    (dtypes.I16, np.array([1000, -2000, 3000], np.int16)),
    (dtypes.I8, np.array([127, -128, 0], np.int8)),
    (dtypes.U64, np.array([2**64 - 1, 0, 5], np.uint64)),
    (dtypes.U32, np.array([2**32 - 1, 0, 5], np.uint32)),
    (dtypes.U16, np.array([65535, 0, 5], np.uint16)),
    (dtypes.U8, np.array([0, 128, 255], np.uint8)),
    (dtypes.BOOL, np.array([True, False, True])),
    (dtypes.BOOL_U8, np.array([1, 0, 1], np.uint8)),
    (dtypes.BOOL_U32, np.array([1, 0, 1], np.uint32)),
    (dtypes.FLEX32, np.array([0.1, 0.2, 0.3], np.float32)),
]


@pytest.mark.parametrize(("dt", "arr"), ROUND_TRIP, ids=[d.name for d, _ in ROUND_TRIP])
@pytest.mark.parametrize("shape", [(3,), (1, 3)])
def test_dtype_round_trip(dt: dtypes.DType, arr: np.ndarray, shape: tuple[int, ...]) -> None:
    out = to_bytes([from_numpy("t", arr.reshape(shape), dtype=dt)], "burnpack")
    t = open_file(out)["t"]
    assert t.dtype == dt and t.shape == shape and t.nbytes == arr.nbytes
    assert t.numpy().tobytes() == arr.tobytes()


def test_scalar_tensor_and_bool_stores_spelled_like_burn() -> None:
    out = to_bytes([from_numpy("s", np.array(42.0, np.float32)), from_numpy("b", np.array([1], np.uint32),
                                                                           dtype=dtypes.BOOL_U32)], "burnpack")
    meta = cbor2.loads(out[10 : 10 + struct.unpack("<I", out[6:10])[0]])
    assert meta["tensors"]["s"]["shape"] == []
    assert meta["tensors"]["b"]["dtype"] == {"Bool": "U32"}
    assert open_file(out)["s"].numpy() == np.float32(42)


DEFAULT_QFLOAT = bytes.fromhex("a1 66 51466c6f6174 a5 65 76616c7565 63 513846 65 73746f7265 a1 69 5061636b6564553332 00"
                               " 64 6d6f6465 69 53796d6d6574726963 66 74656e736f72 f6 65 626c6f636b f6"
                               .replace(" ", ""))


def test_qfloat_passes_through_byte_for_byte() -> None:
    scheme = cbor.RawCbor(DEFAULT_QFLOAT[8:])  # the scheme map after {"QFloat":
    meta = {"tensors": {"q": {"dtype": {"QFloat": scheme}, "shape": [5, 5], "data_offsets": [0, 33]}},
            "metadata": {"format": "burnpack"}}
    blob = cbor.encode(meta)
    assert DEFAULT_QFLOAT in blob
    payload = bytes(range(33))
    src = pack(None, payload, raw_meta=blob)
    r = open_file(src)
    q = r["q"]
    assert q.dtype.kind is dtypes.Kind.QUANTIZED and q.nbytes == 33
    assert burnpack.describe_qfloat(q.dtype)["value"] == "Q8F"
    again = to_bytes(r.tensors, "burnpack", metadata=r.metadata, scalars=r.scalars)
    assert again == src


def test_unsupported_dtype_refused_before_writing(tmp_path: Path) -> None:
    t = from_numpy("f8", np.zeros(4, ml_dtypes.float8_e4m3fn))
    with pytest.raises(UnsupportedDTypeError, match=r"'f8'.*F8_E4M3"):
        save([t], tmp_path / "out.bpk")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------ reader rules


def test_rejects_short_input() -> None:
    with pytest.raises(FormatError, match="insufficient bytes"):
        open_file(b"NRUB", format="burnpack")


def test_rejects_bad_magic() -> None:
    with pytest.raises(FormatError, match="magic"):
        open_file(b"BURN" + bytes(300), format="burnpack")


def test_rejects_version_2_accepts_version_0() -> None:
    good = to_bytes([from_numpy("w", W)], "burnpack")
    with pytest.raises(FormatError, match="version 2"):
        open_file(good[:4] + b"\x02\x00" + good[6:])
    assert open_file(good[:4] + b"\x00\x00" + good[6:]).names() == ["w"]


def test_rejects_huge_metadata_size_before_allocating() -> None:
    with pytest.raises(LimitExceededError, match="metadata size"):
        open_file(header(104857601) + bytes(10))


def test_rejects_metadata_past_eof() -> None:
    with pytest.raises(FormatError, match="past the end"):
        open_file(header(1000) + bytes(10))


def test_rejects_truncated_file(tmp_path: Path) -> None:
    good = to_bytes([from_numpy("w", np.arange(512, dtype=np.float32))], "burnpack")
    p = tmp_path / "t.bpk"
    p.write_bytes(good[: len(good) // 2])
    with pytest.raises(FormatError, match="truncated") as e:
        open_file(p)
    assert str(p) in str(e.value) and "'w'" in str(e.value)


@pytest.mark.parametrize(("meta", "message"), [
    ({"metadata": {}}, "missing field 'tensors'"),
    ({"tensors": [1, 2]}, "'tensors' is not a map"),
    ({"tensors": {"w": {"shape": [2, 2], "data_offsets": [0, 16]}}}, "missing field 'dtype'"),
    ({"tensors": {"w": desc(dtype="F128")}}, "unknown dtype"),
    ({"tensors": {"w": desc(dtype={"Bool": "U16"})}}, "unknown dtype"),
    ({"tensors": {"w": desc(shape=[-2, 2])}}, "shape"),
    ({"tensors": {"w": desc(offsets=[16, 0])}}, "corrupted offset"),
    ({"tensors": {"w": desc(offsets=[0, 12])}}, "needs 16"),
    ({"tensors": {"w": desc(offsets=[8, 24])}}, "aligned"),
    ({"tensors": {"w": desc(offsets=[0, 11 * 1024**3])}}, "limit"),
    ({"tensors": {"w": desc(), "v": desc(shape=[8], offsets=[0, 32])}}, "overlaps"),
    ({"tensors": {"w": desc()}, "metadata": {"a": 1}}, "text to text"),
    ({"tensors": {"w": desc()}, "scalars": {"a": {"Complex": 1}}}, "unknown variant"),
    ({"tensors": {"w": {**desc(), "param_id": -1}}}, "param_id"),
])
def test_rejects_bad_descriptors(meta: dict, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        open_file(pack(meta, bytes(64)))


def test_duplicate_struct_field_is_an_error_but_duplicate_map_key_keeps_last() -> None:
    d = cbor.encode(desc())
    dup_field = b"\xa2\x67tensors\xa1\x61w" + d + b"\x67tensors\xa0"
    with pytest.raises(FormatError, match="duplicate field 'tensors'"):
        open_file(pack(None, bytes(16), raw_meta=dup_field))
    dup_key = b"\xa1\x67tensors\xa2\x61w" + cbor.encode(desc(shape=[4])) + b"\x61w" + d
    r = open_file(pack(None, bytes(16), raw_meta=dup_key))
    assert r["w"].shape == (2, 2)


def test_unknown_keys_ignored_and_indefinite_lengths_accepted() -> None:
    meta = b"\xbf\x67tensors\xbf\x61w" + cbor.encode({**desc(), "extra": 1}) + b"\xff\x65other\x01\xff"
    r = open_file(pack(None, np.arange(4, dtype=np.float32).tobytes(), raw_meta=meta))
    np.testing.assert_array_equal(r["w"].numpy(), [[0, 1], [2, 3]])


def test_cbor_nesting_bomb_is_refused() -> None:
    bomb = b"\xa1\x67tensors" + b"\x81" * 200 + b"\x00"
    with pytest.raises(FormatError, match="deeper than 128"):
        open_file(pack(None, raw_meta=bomb))


def test_cbor_declared_length_bomb_is_refused_without_allocating() -> None:
    bomb = b"\xa1\x67tensors\x9b" + (2**63).to_bytes(8, "big")
    with pytest.raises(FormatError, match="declares"):
        open_file(pack(None, raw_meta=bomb))


def test_tensor_count_limit() -> None:
    n = burnpack.BURN_MAX_TENSOR_COUNT + 1
    entry = cbor.encode({"dtype": "U8", "shape": [0], "data_offsets": [0, 0]})
    body = bytearray(b"\xa1\x67tensors\xba" + n.to_bytes(4, "big"))
    for i in range(n):
        body += cbor.encode(f"t{i}") + entry
    with pytest.raises(LimitExceededError, match="100001 tensors"):
        open_file(pack(None, raw_meta=bytes(body)))


def test_unknown_name_lookup() -> None:
    r = open_file(to_bytes([from_numpy("w", W)], "burnpack"))
    with pytest.raises(TensorNotFoundError, match="'nope'"):
        r["nope"]


# ------------------------------------------------------------------------------------ writer rules


def lazy(name: str, n: int, calls: list[str], *, produce: int | None = None, fail: bool = False) -> LazyTensor:
    def load() -> bytes:
        calls.append(name)
        if fail:
            raise OSError("disk went away")
        return bytes(produce if produce is not None else n * 4)

    return LazyTensor(name, dtypes.F32, (n,), n * 4, load)


def test_planning_reads_nothing_and_each_tensor_is_produced_once_in_order() -> None:
    calls: list[str] = []
    writer = BurnpackWriter([lazy("b", 2, calls), lazy("a", 3, calls), lazy("c", 1, calls)])
    assert calls == [] and writer.total_size == writer.data_start + 512 + 4
    eager = to_bytes([from_numpy(n, np.zeros(k, np.float32)) for n, k in (("b", 2), ("a", 3), ("c", 1))], "burnpack")
    assert to_bytes(writer.tensors, "burnpack") == eager
    assert calls == ["b", "a", "c"]


def test_declared_length_contradicting_shape_is_a_plan_error() -> None:
    t = LazyTensor("a", dtypes.F32, (4,), 8, lambda: bytes(8))
    with pytest.raises(PlanError, match=r"declares 8 bytes.*need 16"):
        BurnpackWriter([t])


def test_duplicate_names_refused() -> None:
    with pytest.raises(PlanError, match="Duplicate tensor name 'w'"):
        BurnpackWriter([from_numpy("w", W), from_numpy("w", W)])


def test_producer_returning_wrong_length_fails(tmp_path: Path) -> None:
    calls: list[str] = []
    with pytest.raises(TensorBytesSizeMismatchError, match=r"'a'.*produced 8 bytes but declares 16"):
        save([lazy("a", 4, calls, produce=8)], tmp_path / "x.bpk")
    assert list(tmp_path.iterdir()) == []


def test_failing_producer_leaves_existing_target_intact(tmp_path: Path) -> None:
    target = tmp_path / "x.bpk"
    target.write_bytes(b"old contents")
    with pytest.raises(OutputError, match="disk went away"):
        save([lazy("a", 4, [], fail=True)], target, overwrite=True)
    assert target.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bpk"]


def test_writer_refuses_what_the_reader_would_reject() -> None:
    big = LazyTensor("huge", dtypes.U8, (11 * 1024**3,), 11 * 1024**3, lambda: b"")
    with pytest.raises(PlanError, match="tensor limit"):
        BurnpackWriter([big])


# ------------------------------------------------------------------------------------ files


def test_extension_rules(tmp_path: Path) -> None:
    written = save([from_numpy("w", W)], tmp_path / "model")
    assert written.endswith("model.bpk") and (tmp_path / "model.bpk").exists() and not (tmp_path / "model").exists()
    assert open_file(tmp_path / "model").names() == ["w"]
    assert BurnpackWriter.resolve_path("model.v1") == "model.v1"
    assert BurnpackWriter.resolve_path("model.") == "model."
    assert BurnpackWriter.resolve_path(".hidden") == ".hidden.bpk"


def test_rewrite_unchanged_is_byte_identical(tmp_path: Path) -> None:
    src = tmp_path / "a.bpk"
    ts = [from_numpy("z", np.arange(5, dtype=np.float32), param_id=1),
          from_numpy("a", np.arange(3, dtype=np.int64), param_id=2**64 - 1),
          from_numpy("m", np.array([True, False]))]
    save(ts, src, metadata={"format": "burnpack", "producer": "burn", "version": "0.22.0-pre.2"},
         scalars={"epoch": Scalar("Int", 3), "lr": Scalar("Float", 1e-4)})
    with open_file(src) as r:
        out = save(r.tensors, tmp_path / "b.bpk", metadata=r.metadata, scalars=r.scalars)
    assert Path(out).read_bytes() == src.read_bytes()


def test_overwrite_refused_by_default(tmp_path: Path) -> None:
    p = tmp_path / "m.bpk"
    save([from_numpy("w", W)], p)
    before = p.read_bytes()
    with pytest.raises(MigratorError, match="already exists"):
        save([from_numpy("w", W * 2)], p)
    assert p.read_bytes() == before
    save([from_numpy("w", W * 2)], p, overwrite=True)
    np.testing.assert_array_equal(open_file(p)["w"].numpy(), W * 2)


def test_writing_onto_the_source_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "m.bpk"
    save([from_numpy("w", W)], p)
    with open_file(p) as r, pytest.raises(MigratorError, match="being read"):
        save(r.tensors, p, overwrite=True, protect=[p])


# ---------------------------------------------------------------- text that is not UTF-8 (surrogates)

_SURROGATE = b"\xed\xa0\x80"  # what a lone \ud800 would be as (invalid) UTF-8; CBOR text must be UTF-8


def _text(raw: bytes) -> bytes:
    return bytes([0x60 + len(raw)]) + raw


@pytest.mark.parametrize("where", ["name", "metadata key", "metadata value", "dtype", "scalar name"])
def test_lone_surrogates_in_cbor_text_are_refused(where: str) -> None:
    """Burn (serde/ciborium) refuses such text; cbor2 agrees; the reader gives a FormatError naming the file."""
    bad = _text(b"w" + _SURROGATE)
    name = bad if where == "name" else _text(b"w")
    dtype = bad if where == "dtype" else cbor.encode("F32")
    descriptor = b"\xa3\x65dtype" + dtype + b"\x65shape\x82\x02\x02\x6cdata_offsets\x82\x00\x10"
    rest, fields = b"", 1
    if where.startswith("metadata"):
        rest, fields = b"\x68metadata\xa1" + (bad + _text(b"v") if where == "metadata key" else _text(b"k") + bad), 2
    if where == "scalar name":
        rest, fields = b"\x67scalars\xa1" + bad + cbor.encode({"UInt": 1}), 2
    meta = bytes([0xA0 + fields]) + b"\x67tensors\xa1" + name + descriptor + rest
    with pytest.raises(cbor2.CBORDecodeError):
        cbor2.loads(meta)
    with pytest.raises(FormatError, match="UTF-8") as e:
        open_file(pack(None, bytes(16), raw_meta=meta))
    assert e.value.file is not None
    str(e.value).encode("utf-8")  # printable


# ------------------------------------------------------------------- a tensor name twice (Burn: last wins)


def _twice(*names: bytes) -> bytes:
    """A tensor map holding each of `names` in turn, with shapes [1], [2], ... (the last is read)."""
    body = b"".join(_text(n) + cbor.encode(desc(shape=[i + 1], offsets=[256 * i, 256 * i + 4 * (i + 1)]))
                    for i, n in enumerate(names))
    return b"\xa1\x67tensors" + bytes([0xA0 + len(names)]) + body


def test_a_repeated_name_keeps_the_last_entry_and_is_reported() -> None:
    r = open_file(pack(None, bytes(768), raw_meta=_twice(b"w", b"v", b"w")))
    assert r["w"].shape == (3,) and sorted(r.names()) == ["v", "w"]
    assert r.duplicate_names == ["w"]
    (warning,) = r.extra()["warnings"]
    assert "1 tensor name(s)" in warning and "'w'" in warning and "last" in warning


def test_repeated_names_reported_escaped_and_capped() -> None:
    names = [b"a\x1b[2J", b"b", b"c", b"d", b"e", b"f", b"g"]
    r = open_file(pack(None, bytes(256 * 14), raw_meta=_twice(*names, *names)))
    assert r.duplicate_names == [n.decode() for n in names]
    (warning,) = r.extra()["warnings"]
    assert warning.isascii() and "'a\\x1b[2J'" in warning and "and 2 more" in warning


def test_no_warning_without_repeats() -> None:
    assert "warnings" not in open_file(pack(None, bytes(512), raw_meta=_twice(b"w", b"v"))).extra()


def test_inspect_prints_the_warning(tmp_path: Path) -> None:
    import contextlib
    import io

    from migrator.cli import main

    path = tmp_path / "dup.bpk"
    path.write_bytes(pack(None, bytes(512), raw_meta=_twice(b"w", b"w")))
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        assert main(["inspect", str(path)]) == 0
    assert "warning: 1 tensor name(s) appear more than once" in err.getvalue()
    with contextlib.redirect_stdout(out := io.StringIO()):
        assert main(["inspect", "--json", str(path)]) == 0
    assert "appear more than once" in out.getvalue()

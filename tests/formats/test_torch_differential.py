"""migrator against torch.load(weights_only=True) on the same bytes: torch's values or a typed error.

A file that torch loads must never give other tensors in migrator (issue 19 item 2). The cases are
real torch.save files whose zip or pickle is then patched: end records whose comment holds another
end record (torch takes the last signature), names that differ only in case (torch looks names up
ignoring ASCII case), a storage key used with two dtypes (torch keeps the first), and a seeded
sample of the fuzz corpus (tools/fuzz.py's seeds and mutations).
"""

from __future__ import annotations

import io
import pickletools
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import migrator
from migrator.core.errors import FormatError

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
from torch_differential import compare, run, torch_load, torch_tensors  # noqa: E402

# ----------------------------------------------------------------------------------------------
# the comparison


def assert_reads_as_torch(raw: bytes) -> dict[str, Any]:
    """The case is one torch loads, and migrator gives exactly its tensors."""
    assert compare(raw) == "same"
    return torch_tensors(torch_load(raw))


# ----------------------------------------------------------------------------------------------
# building patched archives


def saved(sd: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


def members_of(raw: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def local_entry(name: str, data: bytes) -> bytes:
    n = name.encode()
    return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, zlib.crc32(data), len(data), len(data),
                       len(n), 0) + n + data


def central_entry(name: str, data: bytes, offset: int) -> bytes:
    n = name.encode()
    return struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, zlib.crc32(data), len(data),
                       len(data), len(n), 0, 0, 0, 0, 0, offset) + n


def end_record(count: int, cd_size: int, cd_off: int, comment: bytes = b"", declared: int | None = None) -> bytes:
    clen = len(comment) if declared is None else declared
    return struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, cd_size, cd_off, clen) + comment


def zip64_records(count: int, cd_size: int, cd_off: int, at: int, signature: bytes = b"PK\x06\x06") -> bytes:
    rec = struct.pack("<4sQHHIIQQQQ", signature, 44, 45, 45, 0, 0, count, count, cd_size, cd_off)
    return rec + struct.pack("<4sIQI", b"PK\x06\x07", 0, at, 1)


def build_zip(members: list[tuple[str, bytes]]) -> bytes:
    body, cd = b"", b""
    for name, data in members:
        cd += central_entry(name, data, len(body))
        body += local_entry(name, data)
    return body + cd + end_record(len(members), len(cd), len(body))


def two_directories(a: list[tuple[str, bytes]], b: list[tuple[str, bytes]]) -> tuple[bytes, bytes, bytes, int, int]:
    """Members of `a`, then those of `b` that differ; a directory of each. (body, cd_a, cd_b, offsets)."""
    body = b""
    where: dict[tuple[str, bytes], int] = {}
    for name, data in [*a, *b]:
        if (name, data) not in where:
            where[name, data] = len(body)
            body += local_entry(name, data)
    cd_a = b"".join(central_entry(n, d, where[n, d]) for n, d in a)
    cd_b = b"".join(central_entry(n, d, where[n, d]) for n, d in b)
    return body, cd_a, cd_b, len(body), len(body) + len(cd_a)


def state(scale: float) -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(3, 4, generator=g) * scale, "b": torch.arange(5, dtype=torch.int64) * int(scale),
            "h": torch.ones(2, dtype=torch.float16) * scale}


# ----------------------------------------------------------------------------------------------
# (a) end records: torch takes the last signature (with 22 bytes after it)


def end_record_variants() -> dict[str, tuple[bytes, float]]:
    """name -> (file, the scale of the state torch reads)."""
    a, b = members_of(saved(state(1.0))), members_of(saved(state(2.0)))
    body, cd_a, cd_b, off_a, off_b = two_directories(a, b)
    n = len(a)
    inner = end_record(n, len(cd_b), off_b)
    head = body + cd_a + cd_b
    z64_at = len(head)
    return {
        "comment holds the end record of the other directory": (head + end_record(n, len(cd_a), off_a, inner), 2.0),
        "inner record's comment length runs past the file": (
            head + end_record(n, len(cd_a), off_a, end_record(n, len(cd_b), off_b, declared=4000)), 2.0),
        "inner record followed by more comment": (
            head + end_record(n, len(cd_a), off_a, end_record(n, len(cd_b), off_b, b"tail", declared=4) + b"tail"),
            2.0),
        "a signature too close to the end is not a record": (
            head + end_record(n, len(cd_a), off_a, b"xy" + inner[:19]), 1.0),
        "zip64 record names the other directory": (
            head + zip64_records(n, len(cd_b), off_b, z64_at) + end_record(n, len(cd_a), off_a), 2.0),
        "zip64 locator without a zip64 record": (
            head + zip64_records(n, len(cd_b), off_b, z64_at, b"PK\x06\x09") + end_record(n, len(cd_a), off_a), 1.0),
    }


@pytest.mark.parametrize("variant", list(end_record_variants()))
def test_end_record_in_a_comment_reads_as_torch(variant: str) -> None:
    raw, scale = end_record_variants()[variant]
    got = assert_reads_as_torch(raw)
    assert torch.equal(got["w"], state(scale)["w"])  # the variant is the discriminating case it claims


# ----------------------------------------------------------------------------------------------
# (b) names that differ only in case


def renamed(members: list[tuple[str, bytes]], rename: Callable[[str], str]) -> list[tuple[str, bytes]]:
    return [(rename(n), d) for n, d in members]


def case_variants() -> dict[str, tuple[bytes, bool]]:
    """name -> (file, whether migrator must refuse it as ambiguous)."""
    a, b = members_of(saved(state(1.0))), members_of(saved(state(2.0)))
    data0 = next(d for n, d in b if n.endswith("/data/0"))
    root = a[0][0].split("/", 1)[0]
    # another pickle over the same storages (keys, dtypes and sizes), under other names
    other = saved({"x": torch.zeros(3, 4), "y": torch.zeros(5, dtype=torch.int64),
                   "z": torch.zeros(2, dtype=torch.float16)})
    other_pkl = next(d for n, d in members_of(other) if n.endswith("data.pkl"))
    first, rest = a[0], a[1:]
    return {
        "storage name in upper case": (build_zip(renamed(a, lambda n: n.replace("/data/0", "/DATA/0"))), False),
        "DATA.PKL": (build_zip(renamed(a, lambda n: n.replace("data.pkl", "DATA.PKL"))), False),
        "storage folder in upper case": (build_zip(renamed(a, lambda n: n.replace("/data/", "/DATA/"))), False),
        "BYTEORDER": (build_zip(renamed(a, lambda n: n.replace("byteorder", "BYTEORDER"))), False),
        "data/0 and DATA/0": (build_zip([*a, (f"{root}/DATA/0", data0)]), True),
        "data/0 and Data/0 first": (build_zip([first, (f"{root}/Data/0", data0), *rest]), True),
        "data.pkl and DATA.PKL": (build_zip([*a, (f"{root}/DATA.PKL", other_pkl)]), True),
        "byteorder and BYTEORDER": (build_zip([*a, (f"{root}/BYTEORDER", b"big")]), True),
        "data/0 and DATA/0, then the rest": (build_zip([first, (f"{root}/DATA/0", data0), *rest]), True),
    }


@pytest.mark.parametrize("variant", list(case_variants()))
def test_names_that_differ_in_case(variant: str) -> None:
    raw, ambiguous = case_variants()[variant]
    # torch loads every variant (which copy it reads is its lookup's); it refuses entries outside the
    # first entry's folder, case included, so only names below the folder vary here
    assert torch_load(raw) is not None
    if ambiguous:
        with pytest.raises(FormatError, match=r"ambiguous zip: .* differ only in case"):
            migrator.open_file(raw, format="pytorch")
    else:
        assert torch.equal(assert_reads_as_torch(raw)["w"], state(1.0)["w"])


# ----------------------------------------------------------------------------------------------
# (c) one storage key, two storage types: torch keeps the first


def with_storage_keys(raw: bytes, mapping: dict[str, str]) -> bytes:
    """Rewrite the storage keys of data.pkl's persistent ids (same-length keys), rebuilt as a zip."""
    out = []
    for name, data in members_of(raw):
        if name.endswith("data.pkl"):
            buf = bytearray(data)
            ops = list(pickletools.genops(data))
            for i, (op, arg, _) in enumerate(ops):
                if op.name == "GLOBAL" and "Storage" in str(arg):
                    k = i + 1
                    while ops[k][0].name not in ("BINUNICODE", "SHORT_BINUNICODE"):
                        k += 1
                    key_op, key, pos = ops[k]
                    if key in mapping:
                        start = pos + (5 if key_op.name == "BINUNICODE" else 2)
                        buf[start : start + len(key)] = mapping[key].encode()
            data = bytes(buf)
        out.append((name, data))
    return build_zip(out)


TWO_DTYPES = {
    "f32 then f16": ({"a": torch.tensor([1.0, 2.0, 3.0, 4.0]), "b": torch.tensor([1.5, 2.5], dtype=torch.float16)},
                     {"1": "0"}),
    "f16 then f32": ({"a": torch.tensor([1.5, 2.5, 3.5, 4.5], dtype=torch.float16), "b": torch.tensor([1.0, 2.0])},
                     {"1": "0"}),
    "i64 then f32, 2-d": ({"a": torch.arange(6, dtype=torch.int64), "b": torch.ones(2, 3)}, {"1": "0"}),
    "three tensors, the last two share": ({"a": torch.ones(2), "b": torch.arange(8, dtype=torch.int16),
                                           "c": torch.zeros(4, dtype=torch.uint8)}, {"2": "1"}),
    "empty first, then another type": ({"a": torch.zeros(0), "b": torch.zeros(0, dtype=torch.int32)}, {"1": "0"}),
}


@pytest.mark.parametrize("variant", list(TWO_DTYPES))
def test_one_storage_key_with_two_dtypes(variant: str) -> None:
    sd, mapping = TWO_DTYPES[variant]
    raw = with_storage_keys(saved(sd), mapping)
    got = assert_reads_as_torch(raw)
    names = list(sd)
    first, second = names[-2], names[-1]
    if sd[first].numel():  # torch read the second with the first's dtype: the case discriminates
        assert got[second].dtype == sd[first].dtype != sd[second].dtype


def test_torchs_storage_rules_hold_for_its_own_files() -> None:
    """Tied weights and views (one key, one dtype, several tensors) read as torch reads them."""
    base = torch.arange(12.0).reshape(3, 4)
    assert_reads_as_torch(saved({"w": base, "t": base.t(), "row": base[1], "tied": base}))


# ----------------------------------------------------------------------------------------------
# the fuzz corpus: a fixed, seeded sample of mutated files


@pytest.mark.parametrize("reader", ["pytorch-zip", "pytorch-legacy"])
def test_fuzz_corpus_reads_as_torch_or_is_refused(reader: str) -> None:
    """tools/torch_differential.py's run, a fixed sample: no case where both read and disagree."""
    outcomes, differ = run(reader, 300, seed=19)
    assert [(case, what) for case, _, what in differ] == []
    assert outcomes.get("same", 0) >= 5, outcomes  # the sample reaches files both read


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_a_storage_listed_stored_and_deflated_is_refused() -> None:
    """The same name twice, once as torch's stored storage and once compressed: which one torch's lookup
    finds is not defined, so neither is read."""
    a = members_of(saved(state(1.0)))
    root = a[0][0].split("/", 1)[0]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in a:
            z.writestr(name, data)
        z.writestr(f"{root}/data/0", bytes(48), compress_type=zipfile.ZIP_DEFLATED)
    with pytest.raises(FormatError, match=f"lists member {root}/data/0 twice"):
        migrator.open_file(buf.getvalue(), format="pytorch")


@pytest.mark.parametrize("attr", [0x10, 0xFFFF, 0x41ED0010])
def test_a_storage_marked_as_a_directory_is_refused(attr: int) -> None:
    """torch's reader reads no bytes for a member whose DOS attributes say directory, and hands out
    the storage's buffer uninitialised; migrator refuses it instead of reading the bytes."""
    raw = bytearray(saved(state(1.0)))
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as z:
        name = next(i.filename for i in z.infolist() if i.filename.endswith("/data/0")).encode()
    at = next(p for p in range(len(raw)) if raw.startswith(b"PK\x01\x02", p)
              and raw[p + 46 : p + 46 + len(name)] == name)
    struct.pack_into("<I", raw, at + 38, attr)
    assert torch_load(bytes(raw)) is not None
    with pytest.raises(FormatError, match="data/0 is marked as a directory"):
        migrator.open_file(bytes(raw), format="pytorch")

"""What the PyTorch reader keeps and makes for large state_dicts: checked with torch's own files.

The reader builds its tensors after the pickle's objects are gone (a lower peak), in one batch;
these tests check the result against torch and that nothing of the pickle outlives the open.
"""

from __future__ import annotations

import gc
import io
import random
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest

from migrator import safepickle as sp
from migrator.errors import FormatError
from migrator.formats import open_file
from migrator.formats.pytorch import zip as pytorch_zip

torch = pytest.importorskip("torch")


def many_tensors(n: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    sd: dict[str, Any] = {}
    for i in range(n):
        shape = [(3,), (2, 3), (4, 1, 2), ()][i % 4]
        sd[f"layer.{i}.w"] = torch.randn(shape, generator=g)
    base = torch.arange(12.0).reshape(3, 4)
    sd["view.t"] = base.t()  # a strided view between stored tensors keeps its place
    sd["view.row"] = base[1]
    sd["empty"] = torch.zeros(0, 3)
    sd["tied"] = sd["layer.0.w"]
    sd["nested"] = {"a": torch.ones(2), "b": [torch.zeros(1)]}
    return sd


def flat(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    items = d.items() if isinstance(d, dict) else enumerate(d)
    for k, v in items:
        name = f"{prefix}.{k}" if prefix else str(k)
        out.update(flat(v, name) if isinstance(v, (dict, list)) else {name: v})
    return out


@pytest.mark.parametrize("protocol", [2, 4])
def test_many_tensors_in_order_with_torchs_values(tmp_path: Path, protocol: int) -> None:
    sd = many_tensors(3000)
    path = tmp_path / "m.pt"
    torch.save(sd, path, pickle_protocol=protocol)
    expected = flat(sd)
    with open_file(path) as r:
        assert [t.name for t in r.tensors] == list(expected)
        for t in r.tensors:
            want = expected[t.name]
            assert t.shape == tuple(want.shape), t.name
            assert bytes(t.data()) == want.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), t.name
        assert ["layer.0.w", "tied"] in r.shared_storages()
        assert ["view.t", "view.row"] in r.shared_storages()


def test_no_pickle_object_outlives_the_open(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save(many_tensors(2000), path)
    gc.collect()
    with open_file(path) as r:
        assert len(r.tensors) == 2000 + 6
        left = [o for o in gc.get_objects() if type(o) in (sp.TensorRef, sp.StorageRef, sp.ODict)]
        assert left == []


def test_storages_far_apart_and_in_many_reads(tmp_path: Path) -> None:
    """Local headers are read in groups (64 KiB gaps, 1 MiB a read): big tensors between small ones."""
    g = torch.Generator().manual_seed(2)
    sd = {f"small.{i}": torch.randn(3, generator=g) for i in range(12000)}  # > 1 MiB of headers
    for i in range(0, 12000, 2500):
        sd[f"small.{i}"] = torch.randn(70_000, generator=g)  # 280 KB: a gap between headers
    path = tmp_path / "m.pt"
    torch.save(sd, path)
    with open_file(path) as r:
        assert [t.name for t in r.tensors] == list(sd)
        for t in r.tensors:
            assert bytes(t.data()) == sd[t.name].numpy().tobytes(), t.name


def test_a_bad_local_header_is_reported_for_its_tensor(tmp_path: Path) -> None:
    sd = {f"t.{i}": torch.full((4,), float(i)) for i in range(50)}
    path = tmp_path / "m.pt"
    torch.save(sd, path)
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/data/7"))
    raw[info.header_offset : info.header_offset + 4] = b"PK\x09\x09"
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="zip member m/data/7: bad local header signature"):
        open_file(path)


# ----------------------------------------------------------------------------------------------
# the zip central directory: numpy's parse against the entry-by-entry loop


def directory_of(raw: bytes) -> tuple[bytes, int, int]:
    """The central directory bytes, entry count and offset of a (single-disk, non-zip64) zip."""
    eocd = raw.rfind(b"PK\x05\x06")
    n_total, cd_size, cd_off = struct.unpack_from("<HII", raw, eocd + 10)
    return raw[cd_off : cd_off + cd_size], n_total, cd_off


def compare_directories(cd: bytes, n_total: int, cd_off: int, size: int) -> bool:
    """True when the numpy parse answered; it must then equal the loop's result exactly."""
    quick = pytorch_zip._numbered_directory(cd, n_total, cd_off, size)
    try:
        loop: Any = pytorch_zip._directory_entries(cd, n_total, cd_off, size, "x")
    except FormatError as e:
        loop = e
    if quick is None:
        return False
    assert not isinstance(loop, Exception), loop
    assert quick.members == loop.members and list(quick.members) == list(loop.members)
    assert quick.first == loop.first
    assert {k: (list(a), list(b)) for k, (a, b) in quick.data.items()} == {
        k: (list(a), list(b)) for k, (a, b) in loop.data.items()}
    return True


def test_directory_of_torch_files_parsed_alike(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save(many_tensors(300), path)
    raw = path.read_bytes()
    cd, n_total, cd_off = directory_of(raw)
    assert compare_directories(cd, n_total, cd_off, len(raw))
    assert compare_directories(cd, n_total - 7, cd_off, len(raw))  # fewer entries than listed: the first ones


def zip_of(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name in names:
            z.writestr(name, b"0123456789abcdef")
    return buf.getvalue()


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_edited_directories_parse_alike_or_fall_back() -> None:
    """Random edits of names, sizes, methods, flags and offsets: the numpy parse agrees or declines."""
    names = ["archive/data.pkl", "archive/byteorder", *[f"archive/data/{i}" for i in range(40)],
             "archive/data/007", "archive/version", "archive/data/x1", "archive/.data/1", "archive/data/99"]
    raw = zip_of(names)
    cd, n_total, cd_off = directory_of(raw)
    assert compare_directories(cd, n_total, cd_off, len(raw))
    two_roots = zip_of([*names, "other/data/3"])
    assert not compare_directories(*directory_of(two_roots), len(two_roots))  # the loop reads those
    twice = zip_of([*names, "archive/data/5"])
    assert not compare_directories(*directory_of(twice), len(twice))  # the loop names the repeated member
    rng = random.Random(5)
    answered = 0
    for _ in range(1500):
        edited = bytearray(cd)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(edited))
            if rng.random() < 0.5:
                edited[i] = rng.choice(b"0123456789/PK\x01\x02\x00\xffad")
            else:
                edited[i : i + 4] = struct.pack("<I", rng.choice([0, 7, 39, 40, 1 << 31, 0xFFFFFFFF]))
        answered += compare_directories(bytes(edited[: len(cd)]), n_total, cd_off, len(raw))
    assert answered > 300

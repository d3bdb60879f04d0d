"""What the PyTorch reader keeps and makes for large state_dicts: checked with torch's own files.

The reader builds its tensors after the pickle's objects are gone (a lower peak), in one batch;
these tests check the result against torch and that nothing of the pickle outlives the open.
"""

from __future__ import annotations

import gc
import zipfile
from pathlib import Path
from typing import Any

import pytest

from migrator.core.errors import FormatError
from migrator.files.io import open_file
from migrator.formats import safepickle as sp

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

"""Dtype model, format detection, lazy tensors and the no-torch rule of the core."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from migrator import from_numpy, open_file, save, to_bytes
from migrator.core import dtypes
from migrator.core.bytesource import MemorySource
from migrator.core.errors import FormatError, UnknownFormatError, UnsupportedDTypeError
from migrator.core.scalars import Scalar
from migrator.formats.detect import detect, target_format


@pytest.mark.parametrize(("spelling", "expected"), [
    ("F32", dtypes.F32), ("f32", dtypes.F32), ("float32", dtypes.F32), ("torch.bfloat16", dtypes.BF16),
    ("BF16", dtypes.BF16), ("half", dtypes.F16), ("Flex32", dtypes.FLEX32), ("BOOL", dtypes.BOOL),
    ("Bool(U32)", dtypes.BOOL_U32), ("F8_E4M3", dtypes.F8_E4M3), ("float8_e5m2", dtypes.F8_E5M2),
])
def test_parse_spellings(spelling: str, expected: dtypes.DType) -> None:
    assert dtypes.parse(spelling) == expected


def test_parse_unknown_lists_known() -> None:
    with pytest.raises(UnsupportedDTypeError, match=r"unknown dtype 'F128'.*BF16"):
        dtypes.parse("F128")


@pytest.mark.parametrize("dt", [d for d in dtypes.ALL if d.numpy_name], ids=lambda d: d.name)
def test_numpy_views_have_the_declared_width(dt: dtypes.DType) -> None:
    assert dt.numpy().itemsize * 8 == dt.bits


def test_from_numpy_covers_ml_dtypes() -> None:
    assert dtypes.from_numpy(np.dtype(ml_dtypes.bfloat16)) == dtypes.BF16
    assert dtypes.from_numpy(np.dtype(ml_dtypes.float8_e4m3fn)) == dtypes.F8_E4M3
    assert dtypes.from_numpy(np.dtype(np.bool_)) == dtypes.BOOL
    with pytest.raises(UnsupportedDTypeError):
        dtypes.from_numpy(np.dtype(">f4"))


def test_sub_byte_sizes() -> None:
    assert dtypes.F4.nbytes((4,)) == 2 and dtypes.F4.nbytes((3,)) is None
    assert dtypes.F6_E2M3.nbytes((4,)) == 3
    assert dtypes.BOOL_U32.nbytes((2, 2)) == 16 and dtypes.F32.nbytes(()) == 4


def test_scalar_conversions_follow_burn() -> None:
    assert Scalar("Int", 3).as_float() == 3.0
    assert Scalar("UInt", 300).as_int(0, 2**32 - 1) == 300
    with pytest.raises(OverflowError):
        Scalar("Int", 5_000_000_000).as_int(-(2**31), 2**31 - 1)
    with pytest.raises(OverflowError):
        Scalar("Int", -1).as_int(0, 2**32 - 1)
    with pytest.raises(TypeError):
        Scalar("Float", 1.0).as_int()
    with pytest.raises(TypeError):
        Scalar("Int", 1).as_bool()
    with pytest.raises(TypeError):
        Scalar("Bool", True).as_float()
    with pytest.raises(ValueError):
        Scalar("UInt", -1)


def test_detection_by_magic_then_extension(tmp_path: Path) -> None:
    t = [from_numpy("w", np.ones(2, np.float32))]
    assert detect(MemorySource(to_bytes(t, "burnpack"))) == "burnpack"
    assert detect(MemorySource(to_bytes(t, "safetensors"))) == "safetensors"
    odd = tmp_path / "weights.data"  # magic wins over a misleading name
    save(t, odd, format="safetensors")
    assert open_file(odd).format == "safetensors"
    with pytest.raises(UnknownFormatError, match="unrecognised"):
        detect(MemorySource(b"\x00" * 64), "x.data")
    assert target_format("x.safetensors") == "safetensors" and target_format("x") == "burnpack"
    with pytest.raises(UnknownFormatError, match=r"\.onnx"):
        target_format("x.onnx")


def test_views_are_zero_copy_and_read_only() -> None:
    blob = bytearray(to_bytes([from_numpy("w", np.arange(4, dtype=np.int32))], "burnpack"))
    r = open_file(blob)
    arr = r["w"].numpy()
    assert not arr.flags.writeable
    blob[256] = 9  # the view shares the caller's buffer
    assert arr[0] == 9


def test_missing_file_is_a_format_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=r"nope.safetensors.*cannot open"):
        open_file(tmp_path / "nope.safetensors")


def test_core_never_imports_torch() -> None:
    code = textwrap.dedent("""
        import sys, pkgutil, importlib, migrator
        for m in pkgutil.walk_packages(migrator.__path__, "migrator."):
            importlib.import_module(m.name)
        print("torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


MEMORY_PROBE = textwrap.dedent("""
    import sys
    from migrator import open_file
    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    with open_file(sys.argv[1]) as r:
        before = hwm()
        total = 0
        for t in r.tensors:
            total += float(t.numpy().sum())
    print(hwm() - before)
""")


@pytest.mark.parametrize(("fmt", "ext"), [("burnpack", "bpk"), ("safetensors", "safetensors"), ("pytorch", "pt")])
def test_reading_every_tensor_keeps_peak_rss_near_one_tensor(tmp_path: Path, fmt: str, ext: str) -> None:
    tensor_mb = 16
    path = tmp_path / f"m.{ext}"
    save([from_numpy(f"t{i}", np.full(tensor_mb * 2**18, i, np.float32)) for i in range(16)], path)
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(path)], capture_output=True, text=True, check=True)
    growth = int(out.stdout)
    assert growth < 3 * tensor_mb * 2**20, f"peak RSS grew {growth / 2**20:.0f} MiB for a 256 MiB file"


def test_file_truncated_after_open_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "m.bpk"
    save([from_numpy("w", np.ones(100_000, np.float32))], path)
    with open_file(path) as r:
        with open(path, "r+b") as f:
            f.truncate(1000)
        with pytest.raises(FormatError, match="cannot map bytes"):
            r["w"].data()

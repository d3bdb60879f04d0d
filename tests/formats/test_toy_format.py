"""A new read-only format is one folder and one registration: a toy format written here, in `tmp_path`,
is read through `inspect`, `convert` and a recipe, and shows in every list derived from the registry.

The toy's files are made by this test with numpy (`struct` header, float32 data); what migrator reads
from them is compared with those arrays, and what it writes is read back by the safetensors library."""

from __future__ import annotations

import json
import struct
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from migrator.cli import main
from migrator.formats import registry

TOY_MODULE = '''
"""A toy format: b"TOY1", a u32 count, then per tensor a u16 name length, the name, a u8 rank and u32 dims;
then every tensor's float32 bytes in that order."""

import struct

from migrator.core.dtypes import F32
from migrator.core.errors import FormatError
from migrator.core.tensor import stored
from migrator.formats.base import Reader
from migrator.formats.spec import FormatSpec, Sniff


class ToyReader(Reader):
    format = "toy"

    def __init__(self, source, *, limits=None):
        self.source, self.metadata, self.scalars, self.tensors = source, {}, {}, []
        head = source.read(0, min(source.size, 1 << 16), "toy header")
        (n,) = struct.unpack_from("<I", head, 4)
        pos, entries = 8, []
        for _ in range(n):
            (length,) = struct.unpack_from("<H", head, pos)
            name = head[pos + 2:pos + 2 + length].decode()
            rank = head[pos + 2 + length]
            shape = struct.unpack_from(f"<{rank}I", head, pos + 3 + length)
            pos += 3 + length + 4 * rank
            entries.append((name, tuple(shape)))
        for name, shape in entries:
            nbytes = 4 * int(__import__("math").prod(shape))
            if pos + nbytes > source.size:
                raise FormatError("truncated toy file", file=source.label, tensor=name)
            self.tensors.append(stored(name, F32, shape, source, pos, nbytes))
            pos += nbytes


SPEC = FormatSpec(name="toy", title="Toy", summary="a toy format", extensions=(".toy",),
                  recognized_by="magic TOY1", sniffs=(Sniff(lambda head, size: head[:4] == b"TOY1"),),
                  reader="toyfmt:ToyReader")
'''


def toy_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    head = b"TOY1" + struct.pack("<I", len(arrays))
    for name, a in arrays.items():
        raw = name.encode()
        head += struct.pack("<H", len(raw)) + raw + struct.pack(f"<B{a.ndim}I", a.ndim, *a.shape)
    return head + b"".join(np.ascontiguousarray(a, "<f4").tobytes() for a in arrays.values())


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, np.ndarray]]:
    """The toy format, registered (one folder, one call), and its file `model.toy` holding these arrays."""
    (tmp_path / "toyfmt").mkdir()
    (tmp_path / "toyfmt" / "__init__.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import toyfmt  # type: ignore[import-not-found]

    registry.register(toyfmt.SPEC)
    rng = np.random.default_rng(42)
    arrays = {"enc.weight": rng.standard_normal((3, 4)).astype(np.float32),
              "enc.bias": rng.standard_normal(4).astype(np.float32)}
    (tmp_path / "model.toy").write_bytes(toy_bytes(arrays))
    monkeypatch.chdir(tmp_path)
    yield arrays
    registry.unregister("toy")
    sys.modules.pop("toyfmt", None)


def test_inspect_reads_the_toy_detected_or_named(toy: dict[str, np.ndarray],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for extra in ([], ["--format", "toy"]):
        assert main(["inspect", "model.toy", "--json", *extra]) == 0
        listed = {t["name"]: t for t in json.loads(capsys.readouterr().out)["tensors"]}
        assert {n: (t["dtype"], t["shape"]) for n, t in listed.items()} == {
            n: ("F32", list(a.shape)) for n, a in toy.items()}


def test_convert_writes_the_toys_values(toy: dict[str, np.ndarray], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "model.toy", "out.safetensors"]) == 0
    assert main(["convert", "model.toy", "named.safetensors", "--from", "toy"]) == 0
    for out in ("out.safetensors", "named.safetensors"):
        back = load_file(out)
        assert back.keys() == toy.keys()
        for name, a in toy.items():
            np.testing.assert_array_equal(back[name], a)


@pytest.mark.parametrize("fmt", ["auto", "toy"])
def test_a_recipe_reads_the_toy(toy: dict[str, np.ndarray], tmp_path: Path, fmt: str) -> None:
    """Detected by its magic, or named in the recipe's `format:` (validated against the registry)."""
    (tmp_path / "r.yaml").write_text(textwrap.dedent(f"""\
        version: 1
        source:
          path: model.toy
          format: {fmt}
        remap:
          - from: '^enc\\.(.*)$'
            to: 'encoder.$1'
        target:
          path: out.safetensors
        """))
    assert main(["run", "r.yaml", "--no-progress"]) == 0
    back = load_file(tmp_path / "out.safetensors")
    assert sorted(back) == ["encoder.bias", "encoder.weight"]
    np.testing.assert_array_equal(back["encoder.weight"], toy["enc.weight"])
    np.testing.assert_array_equal(back["encoder.bias"], toy["enc.bias"])


def test_a_recipe_cannot_write_the_read_only_toy(toy: dict[str, np.ndarray], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "w.yaml").write_text("version: 1\nsource:\n  path: model.toy\ntarget:\n  path: out.bin\n"
                                     "  format: toy\n")
    assert main(["validate", "w.yaml"]) == 2
    expected = "'auto', 'burnpack', 'safetensors', 'pytorch', 'gguf', 'dcp' or 'torch_dist'"
    assert f"target.format: expected {expected}, got 'toy'" in capsys.readouterr().err


def test_the_toy_is_in_every_derived_list_and_read_only(toy: dict[str, np.ndarray],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert "toy" in registry.names(readable=True) and "toy" not in registry.names(writable=True)
    assert "| a toy format | `.toy` | magic TOY1 | yes | no |" in registry.docs_table()
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    assert "toy" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:  # read only: no writer, a usage error
        main(["convert", "model.toy", "x.toy"])
    assert usage.value.code == 2
    assert "Toy is read only" in capsys.readouterr().err
    Path("junk.bin").write_bytes(b"\x00" * 64)
    assert main(["inspect", "junk.bin", "--format", "auto"]) == 1  # .bin: PyTorch by extension
    Path("junk.dat").write_bytes(b"\x00" * 64)
    assert main(["inspect", "junk.dat"]) == 1
    assert "Toy (magic TOY1)" in capsys.readouterr().err  # the detection message names it


def test_registration_is_undone(tmp_path: Path) -> None:
    assert "toy" not in registry.names(folders=True)
    with pytest.raises(ValueError, match="built in"):
        registry.unregister("burnpack")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.spec("gguf"))

"""The scheme framework with a toy scheme defined here (what a new scheme module does): int8 codes
`M.q` with a scale per row `M.s`, declared `quant_method: toy`, yield `M.weight` = q * s. Checks the
registry, that a logical name unlike its parts' takes the first part's place, that bands split rows
by each banded part's bytes per row, the kernel plug point (same bits or refused), and the refusals
the reader makes for every scheme (a logical name that is another stored tensor's)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migrator.formats.quantized import KERNELS, SCHEMES, Band, QuantizationError, QuantizedWeight, Scheme
from tests.support.cli import migrate_in_process

safetensors_numpy = pytest.importorskip("safetensors.numpy")


@pytest.fixture
def toy() -> Iterator[type[Scheme]]:
    class Toy(Scheme, name="toy"):
        method = "toy"

        @classmethod
        def parse(cls, config: Mapping[str, Any], file: str) -> Toy:
            return cls(config, file)

        def describe(self) -> str:
            return "toy int8 rows"

        def weights(self, tensors):  # type: ignore[no-untyped-def]
            out = []
            for t in tensors.values():
                if t.name.endswith(".q"):
                    module = t.name[:-2]
                    if module + ".s" not in tensors:
                        raise QuantizationError("no scale", file=t.origin, tensor=t.name)
                    out.append(QuantizedWeight(module + ".weight", tuple(t.shape), {"q": t.name, "s": module + ".s"},
                                               banded=frozenset({"q", "s"})))
            return out

        def dequantize(self, weight: QuantizedWeight, band: Band) -> np.ndarray:
            q = band.parts["q"].astype(np.float32)
            return q * band.parts["s"].astype(np.float32)  # s: (rows, 1) per band

    try:
        yield Toy
    finally:
        SCHEMES.pop("toy", None)
        KERNELS.pop("toy", None)


def folder(tmp_path: Path, extra: dict[str, np.ndarray] | None = None) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    tensors = {"a.q": rng.integers(-128, 127, size=(300, 40), dtype=np.int8),
               "a.s": rng.random((300, 1), dtype=np.float32),
               "norm.weight": rng.random(40, dtype=np.float32), **(extra or {})}
    src = tmp_path / "toy"
    src.mkdir()
    safetensors_numpy.save_file(tensors, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "toy"}}))
    return src, tensors


def test_a_scheme_registers_and_dequantizes_in_bands(toy: type[Scheme], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import migrator.files.quantized as q
    from migrator.files.io import open_file

    assert SCHEMES["toy"] is toy
    src, tensors = folder(tmp_path)
    monkeypatch.setattr(q, "BAND_BYTES", 40 * 4 * 7)  # 7 rows a band: 43 bands, the last of 6 rows
    with open_file(src, dequantize="F32") as r:
        assert sorted(t.name for t in r.tensors) == ["a.weight", "norm.weight"]
        got = r["a.weight"].numpy()
        assert [len(p) for p in r["a.weight"].chunks()][-1] == 6 * 40 * 4  # type: ignore[misc]
    assert np.array_equal(got, tensors["a.q"].astype(np.float32) * tensors["a.s"])


def test_a_kernel_gives_the_bits_or_declines(toy: type[Scheme], tmp_path: Path) -> None:
    from migrator.files.io import open_file

    src, _ = folder(tmp_path)
    calls = []

    def kernel(scheme: Scheme, weight: QuantizedWeight, band: Band, to: Any) -> np.ndarray | None:
        calls.append(band.start)
        return None if band.start else np.zeros((band.stop - band.start, weight.columns), dtype=np.uint32)

    KERNELS["toy"] = kernel
    with open_file(src, dequantize="F32") as r:
        got = r["a.weight"].numpy()
    assert calls == [0]  # one band: the kernel took it (zeros), so the numpy path did not
    assert not got.any()


def test_a_logical_name_that_is_another_stored_tensor_is_refused(toy: type[Scheme], tmp_path: Path) -> None:
    src, _ = folder(tmp_path, {"a.weight": np.zeros((2, 2), dtype=np.float32)})
    p = migrate_in_process("convert", str(src), str(tmp_path / "o.safetensors"), "--dtype", "F32")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "tensor 'a.weight'" in p.stderr and "would take the name" in p.stderr


def test_a_scheme_name_is_registered_once(toy: type[Scheme]) -> None:
    with pytest.raises(TypeError, match="defined twice"):
        class Again(Scheme, name="toy"):  # defining it is the test
            method = "toy"

"""ggml block types against gguf-py (the oracle): every dequantizer bit-equal to
`gguf.quants.dequantize`, the five quantizers bit-equal to `gguf.quants.quantize`, the IQ grids equal.

gguf-py cannot quantize the K-quant and IQ types, so their blocks are random bytes with finite f16
scales written into the scale fields (random bytes there would make NaN/inf scales)."""

from __future__ import annotations

import numpy as np
import pytest

from migrator.formats.gguf import quants
from migrator.formats.gguf.constants import BY_NAME

gguf = pytest.importorskip("gguf")
from tests.support.gguf_blocks import random_blocks  # noqa: E402

GQ = gguf.GGMLQuantizationType


@pytest.fixture(params=["numpy", "compiled"])
def loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: with the compiled loops of migrator/core/kernels/gguf.c and kquants.c (where a type has one) and
    with numpy alone."""
    from migrator.core import native

    if request.param == "numpy":
        monkeypatch.setattr(native, "kernels", None)
    elif quants._kernels() is None:
        pytest.skip("the compiled kernels are not built (or MIGRATOR_NO_KERNELS is set)")
    return str(request.param)

# byte offsets of each type's f16 scale fields inside a block
READ_TYPES = sorted(quants.DEQUANTIZERS)
WRITE_TYPES = sorted(quants.QUANTIZERS)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.astype(np.float32).view(np.uint32),
                                                 b.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("name", READ_TYPES)
def test_dequantize_bit_equal_to_gguf_py(name: str, loops: str) -> None:
    t = BY_NAME[name]
    blocks = random_blocks(name, 3000)  # more than one slab
    ours = quants.dequantize(blocks.tobytes(), t)
    ref = gguf.quants.dequantize(blocks, GQ[name]).reshape(-1)
    assert same_bits(ours, ref)


def test_compiled_loops_cover_the_common_types() -> None:
    """The types of most files people run have compiled loops (the rest use numpy)."""
    k = quants._kernels()
    if k is None:
        pytest.skip("the compiled kernels are not built")
    one = {"Q8_0": 34, "Q4_0": 18, "Q4_K": 144, "Q6_K": 210}
    for name, size in one.items():
        out = np.empty(BY_NAME[name].block_size, np.float32)
        assert k.gguf_blocks(f"dequantize {name}", bytes(size), out) is True, name
    assert k.gguf_blocks("dequantize IQ2_XS", bytes(74), np.empty(256, np.float32)) is False
    with pytest.raises(ValueError, match="do not match"):
        k.gguf_blocks("dequantize Q8_0", bytes(33), np.empty(32, np.float32))


def test_every_type_llama_cpp_writes_is_read() -> None:
    """Every ggml type gguf-py can dequantize (what llama.cpp writes today) is read here too, except
    the two ggml uses only inside dot products and Q1_0 (no dequantizer in gguf-py to check it by)."""
    theirs = {t.name for t in GQ if t.name in gguf.quants._type_traits or t.name in ("F32", "F16")}
    ours = set(quants.DEQUANTIZERS) | {"F32", "F16", "BF16"}
    assert theirs <= ours, theirs - ours


def quantize_inputs(block: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal((512, 4 * block)).astype(np.float32)
    ties = (rng.integers(-16, 16, (64, block)) + 0.5).astype(np.float32)  # x*id lands on .5 often
    ties[:, 0] = 127 / 8 * 8  # a block maximum that makes id an exact power-of-two-ish scale
    mixed = normal.copy()
    mixed[::7] = 0  # all-zero blocks: d = 0
    mixed[1::7] *= 1e-30  # subnormal scales
    mixed[2::7] = np.abs(mixed[2::7])  # one-signed blocks
    mixed[3::7, ::3] = -mixed[3::7, ::3].max()  # repeated extreme values (argmax ties)
    tiny = normal[:64] * np.float32(1e-37)  # 1/d overflows to inf: numpy's casts of inf and NaN decide
    odd = normal[:64].copy()
    odd[0, 3], odd[1, 5], odd[2, :] = np.inf, -np.inf, np.nan  # non-finite inputs, and a block of NaN
    return {"normal": normal, "ties": ties, "mixed": mixed, "big": normal * 6e4, "tiny": tiny,
            "subnormal": normal[:64] * np.float32(1e-41), "non-finite": odd}


@pytest.mark.parametrize("name", WRITE_TYPES)
def test_quantize_bit_equal_to_gguf_py(name: str, loops: str) -> None:
    t = BY_NAME[name]
    for label, x in quantize_inputs(t.block_size).items():
        ours = quants.quantize(x, t)
        with np.errstate(all="ignore"):
            ref = gguf.quants.quantize(x, GQ[name]).reshape(-1)
        assert ours.tobytes() == ref.tobytes(), f"{name} {label}"


def test_quantize_more_than_one_slab(loops: str) -> None:
    x = np.random.default_rng(3).standard_normal(32 * (quants.SLAB_BLOCKS * 2 + 5)).astype(np.float32)
    for name in WRITE_TYPES:
        assert quants.quantize(x, BY_NAME[name]).tobytes() == gguf.quants.quantize(x, GQ[name]).tobytes(), name


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"])
def test_iq_grids_equal_gguf_py(name: str) -> None:
    cls = gguf.quants._type_traits[GQ[name]]
    cls.init_grid()
    assert np.array_equal(quants.grid(name), np.asarray(cls.grid).reshape(cls.grid_shape))


def test_ksigns_equal_gguf_py() -> None:
    ref = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)
    bits = np.unpackbits(ref[:, None], axis=1, bitorder="little")
    assert np.array_equal(quants._ksigns(), np.where(bits == 0, 1.0, -1.0).astype(np.float32))

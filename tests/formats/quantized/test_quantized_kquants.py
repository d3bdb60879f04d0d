"""FP8 -> GGUF K-quants (Q4_K, Q6_K) in one stream: each linear weight dequantized, permuted as llama.cpp's
converter permutes it, and quantized. gguf-py has no K-quant quantizer, only their reference dequantizer:
gguf-py's dequantization of every written block is within the type's error bound of compressed-tensors'
dequantization of the FP8 weight, and the blocks are the ones migrator's quantizer gives those reference
values (that quantizer is byte-equal to ggml's reference in test_gguf_llamacpp.py): the dequantization
on the way changed no bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import migrate_in_process
from tests.support.quantized import fp8_folder
from tests.support.quantized_gguf import gguf_expected

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
pytest.importorskip("compressed_tensors")

# (rms error / rms value, max error / block range), as test_gguf_kquants.py bounds them
BOUNDS = {"Q4_K": (0.085, 0.05), "Q6_K": (0.022, 0.012)}


@pytest.mark.parametrize("qtype", list(BOUNDS))
def test_fp8_to_k_quants_equals_the_reference_dequantization_quantized(tmp_path: Path, qtype: str) -> None:
    from migrator.formats.gguf import quants
    from migrator.formats.gguf.constants import BY_NAME

    if quants._kernels() is None:
        pytest.skip("K-quants are written by the compiled kernels, which are not built")
    src, stored = fp8_folder(tmp_path / "fp8", hidden=256, intermediate=512)
    config = json.loads((src / "config.json").read_text())
    p = migrate_in_process("convert", str(src), str(tmp_path / "m.gguf"), "--dtype", "F32", "--quantize", qtype)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout + p.stderr
    tensors = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}
    want = gguf_expected(stored, config, torch.float32)
    assert len(want) == 14
    rms_bound, max_bound = BOUNDS[qtype]
    for name, values in want.items():
        t = tensors[name]
        assert t.tensor_type.name == qtype, name
        blocks = np.asarray(t.data).reshape(values.shape[0], -1)
        back = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype]).reshape(values.shape)
        err = back - values
        assert np.sqrt((err ** 2).mean()) <= rms_bound * np.sqrt((values ** 2).mean()), name
        ranges = np.ptp(values.reshape(-1, 256), axis=1)
        assert (np.abs(err.reshape(-1, 256)).max(axis=1) <= max_bound * ranges + 1e-12).all(), name
        ours = quants.quantize(np.ascontiguousarray(values), BY_NAME[qtype])
        assert np.array_equal(blocks.reshape(-1), np.asarray(ours).reshape(-1)), name

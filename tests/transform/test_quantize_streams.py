"""The streamed FP8 weight and weight_scale of `transform.quantize`, asked for in either order, in
several bands and whole: the same bytes as compressed-tensors' `calculate_qparams` + `quantize` of the
weight, whichever of the two tensors a writer reads first (the scale's own pass, or the weight's)."""

from __future__ import annotations

import numpy as np
import pytest

from migrator import from_numpy
from migrator.transform import quantize as tq

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
from compressed_tensors.quantization.lifecycle.forward import quantize as ct_quantize  # noqa: E402
from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402


def oracle(w: torch.Tensor) -> tuple[bytes, bytes]:
    args = PRESET_SCHEMES["FP8_DYNAMIC"]["weights"]
    scale, zp = calculate_qparams(torch.amin(w, dim=1, keepdim=True), torch.amax(w, dim=1, keepdim=True), args)
    q = ct_quantize(x=w, scale=scale, zero_point=zp, args=args, dtype=torch.float8_e4m3fn)
    return q.view(torch.uint8).numpy().tobytes(), scale.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("scale_first", [True, False])
def test_either_order_gives_compressed_tensors_bytes(monkeypatch: pytest.MonkeyPatch, scale_first: bool) -> None:
    monkeypatch.setattr(tq, "BAND_BYTES", 64 * 4 * 5)  # 5 rows per band: several bands, the last short
    w = torch.randn(23, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    t = from_numpy("layer.q_proj.weight", w)
    plan = tq.plan_quantization("FP8_DYNAMIC", None, [t], {}, None, tq.SourceFacts("safetensors"))
    weight, scale = plan.replaced[0]
    if scale_first:
        got_scale, got_weight = bytes(scale.loader()), b"".join(bytes(c) for c in weight.chunks())
    else:
        got_weight, got_scale = b"".join(bytes(c) for c in weight.chunks()), bytes(scale.loader())
    want_weight, want_scale = oracle(w)
    assert got_weight == want_weight and got_scale == want_scale
    assert bytes(weight.data()) == want_weight  # whole, through its loader
    assert weight.dtype.name == "F8_E4M3" and scale.shape == (23, 1) and scale.dtype.name == "BF16"
    assert np.frombuffer(got_scale, dtype=np.uint16).size == 23

"""Shared test helpers (gguf_blocks); moved from the test files that first needed them."""

from __future__ import annotations

import numpy as np

from migrator.formats.gguf.constants import BY_NAME

# byte offsets of each type's f16 scale fields inside a block
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "TQ1_0": (52,), "TQ2_0": (64,), "MXFP4": (), "NVFP4": (),
    "IQ4_NL": (0,), "IQ4_XS": (0,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,),
    "IQ3_S": (0,), "IQ1_S": (0,), "IQ1_M": (),
}


def random_blocks(name: str, n: int, seed: int = 0) -> np.ndarray:
    """n blocks of random bytes whose f16 scales are finite (normal values of varied magnitude)."""
    t = BY_NAME[name]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, t.type_size), dtype=np.uint8)
    for at in F16_FIELDS[name]:
        d = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 2, n)).astype(np.float16)
        blocks[:, at:at + 2] = d.view(np.uint8).reshape(n, 2)
    if name == "IQ1_M":  # its f16 scale is spread over the top nibbles of four u16s
        d = (rng.standard_normal(n) * 1e-2).astype(np.float16).view(np.uint16)
        sc = blocks[:, 48:56].copy().view("<u2")
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        blocks[:, 48:56] = sc.view(np.uint8)
    return blocks

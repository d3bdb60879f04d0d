"""A Llama-shaped model for the GGUF rows of RESULTS.md (issue 28): hidden 2048, FFN 5632, 5 layers,
vocab 32000 (1.55 GB as F32, largest tensor 250 MiB), written to FOLDER as `model.safetensors` (F32)
and `q8.gguf` (every 2-D tensor Q8_0, by gguf-py).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/gguf_model.py /tmp/ggbig
    cd /tmp/ggbig && /usr/bin/time -v migrate convert q8.gguf out.safetensors --no-progress
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

import migrator

H, F, L, V = 2048, 5632, 5, 32000


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H),
                                          "model.norm.weight": (H,)}
    for i in range(L):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (H, H), p + "self_attn.k_proj.weight": (H, H),
                   p + "self_attn.v_proj.weight": (H, H), p + "self_attn.o_proj.weight": (H, H),
                   p + "mlp.gate_proj.weight": (F, H), p + "mlp.up_proj.weight": (F, H),
                   p + "mlp.down_proj.weight": (H, F),
                   p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,)}
    arrays = {k: rng.standard_normal(s, dtype=np.float32) * np.float32(0.02) for k, s in shapes.items()}
    migrator.save(arrays, folder / "model.safetensors", overwrite=True)
    w = gguf.GGUFWriter(str(folder / "q8.gguf"), "llama")
    for k, a in arrays.items():
        q8 = gguf.GGMLQuantizationType.Q8_0
        if a.ndim == 2:
            w.add_tensor(k, gguf.quants.quantize(a, q8), raw_dtype=q8)
        else:
            w.add_tensor(k, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

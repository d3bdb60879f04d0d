"""A Llama-shaped model for the GGUF rows of RESULTS.md (issue 28): hidden 2048, FFN 5632, 5 layers,
vocab 32000 (1.55 GB as F32, largest tensor 250 MiB), written to FOLDER as `model.safetensors` (F32)
with a `config.json` (so FOLDER is a Hugging Face Llama folder) and `q8.gguf` (every 2-D tensor
Q8_0, by gguf-py).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/gguf_model.py /tmp/ggbig
    cd /tmp/ggbig && /usr/bin/time -v migrate convert q8.gguf out.safetensors --no-progress

llama.cpp's way to a K-quant mix, for comparison (needs `make test-llamacpp`'s llama-cpp-python on
PYTHONPATH): an F32 GGUF, then llama-quantize in-process on NTHREAD threads:

    PYTHONPATH=$PWD:.venv/llamacpp-0.3.36 .venv/bin/python benchmarks/gguf_model.py --llama-quantize \
        f32.gguf theirs-q4km.gguf Q4_K_M 2
"""

from __future__ import annotations

import ctypes
import json
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
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": F,
              "num_hidden_layers": L, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": V,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
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


FTYPES = {"Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18}  # llama_ftype


def llama_quantize(src: str, dst: str, mix: str, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = FTYPES[mix], threads
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize failed on {src}")


if __name__ == "__main__":
    if sys.argv[1] == "--llama-quantize":
        llama_quantize(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main(Path(sys.argv[1]))

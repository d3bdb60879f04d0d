"""Write a small BERT-shaped SafeTensors checkpoint for the demo (numpy only, deterministic)."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from migrator import from_numpy, save


def tiny_bert(layers: int = 2, hidden: int = 64, vocab: int = 512, ffn: int = 128) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    t: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": w(vocab, hidden),
        "embeddings.position_embeddings.weight": w(128, hidden),
        "embeddings.LayerNorm.weight": np.ones(hidden, np.float32),
        "embeddings.LayerNorm.bias": np.zeros(hidden, np.float32),
        "embeddings.position_ids": np.arange(128, dtype=np.int64)[None, :],
    }
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            t[p + f"attention.self.{name}.weight"] = w(hidden, hidden)
            t[p + f"attention.self.{name}.bias"] = w(hidden)
        t[p + "attention.output.dense.weight"] = w(hidden, hidden)
        t[p + "attention.output.LayerNorm.weight"] = np.ones(hidden, np.float32)
        t[p + "intermediate.dense.weight"] = w(ffn, hidden)
        t[p + "output.dense.weight"] = w(hidden, ffn).astype(ml_dtypes.bfloat16)
    return t


def main(out_dir: str) -> None:
    path = Path(out_dir) / "tiny-bert.safetensors"
    tensors = [from_numpy(name, arr) for name, arr in tiny_bert().items()]
    save(tensors, path, metadata={"format": "pt"}, overwrite=True)
    print(f"generated {path} ({len(tensors)} tensors)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo-out")

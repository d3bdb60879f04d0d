"""Megatron-core `torch_dist` checkpoint folders (`.metadata`, `__R_K.distcp` rank files, `metadata.json`,
`common.pt`): the seed is a tiny checkpoint laid out as the tests lay it out
(`tests/support/torch_dist.py`'s `two_rank_folder`: stacked layers, a padded vocabulary, Megatron-LM's
args, two rank files), and a case is one of its files replaced: the first byte of the input names
which (`VICTIMS[data[0] % 5]`), the rest are that file's bytes. Each seed is one file unchanged."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import REPO
from .common import _torch

VICTIMS = (".metadata", "common.pt", "__0_0.distcp", "__1_0.distcp", "metadata.json")
"""The files a case can replace: DCP's pickled metadata, megatron's common values, each rank's chunks,
the backend's name."""

_FILES: dict[str, bytes] = {}


def _support() -> Any:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import tests.support.torch_dist as torch_dist  # the tests' layout, so seeds and tests share it

    return torch_dist


def _checkpoint() -> dict[str, bytes]:
    """Every file of the seed checkpoint, name -> bytes (made once)."""
    if not _FILES:
        import argparse

        torch = _torch()
        g = torch.Generator().manual_seed(0)
        sd = {"embedding.word_embeddings.weight": torch.randn(8, 4, generator=g),
              "decoder.layers.self_attention.linear_qkv.weight": torch.randn(2, 6, 4, generator=g),
              "decoder.layers.mlp.experts.experts.linear_fc2.weight": torch.randn(2, 3, 4, 5, generator=g),
              "decoder.final_layernorm.weight": torch.randn(4, generator=g).to(torch.bfloat16)}
        args = argparse.Namespace(num_layers=2, num_experts=3, hidden_size=4, num_attention_heads=2,
                                  padded_vocab_size=8, vocab_size=6, params_dtype=torch.float32)
        with tempfile.TemporaryDirectory() as d:
            root = Path(d) / "ckpt"
            _support().two_rank_folder(root, sd, args, "decoder.layers.mlp.experts.experts.linear_fc2.weight")
            for f in sorted(root.iterdir()):
                _FILES[f.name] = f.read_bytes()
    return _FILES


def torch_dist_seeds() -> list[bytes]:
    """Each replaceable file unchanged, behind the byte that names it."""
    files = _checkpoint()
    return [bytes([i]) + files[name] for i, name in enumerate(VICTIMS)]


def victim(data: bytes) -> str:
    return VICTIMS[data[0] % len(VICTIMS)] if data else VICTIMS[0]


@contextlib.contextmanager
def case_folder(data: bytes, path: Path | None) -> Iterator[Path]:
    """The seed checkpoint with the file `data[0]` names holding `data[1:]` (under `path`'s folder when given)."""
    base = Path(tempfile.mkdtemp(prefix="torch-dist-case-", dir=None if path is None else path.parent))
    try:
        root = base / "ckpt"
        root.mkdir()
        replaced = victim(data)
        for name, blob in _checkpoint().items():
            (root / name).write_bytes(data[1:] if name == replaced else blob)
        yield root
    finally:
        shutil.rmtree(base, ignore_errors=True)


def torch_dist_fields(data: bytes) -> list[tuple[int, int, str]]:
    """The replaced file's length, offset and count fields (a pickle's, or its torch.save zips'), in `data`."""
    from .pytorch import pytorch_fields

    body = data[1:]
    if victim(data) == "metadata.json":
        return []
    kind = "pytorch-legacy" if victim(data) == ".metadata" else "pytorch-zip"  # .metadata is a bare pickle
    return [(pos + 1, width, order) for pos, width, order in pytorch_fields(body, kind)]

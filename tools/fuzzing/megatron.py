"""Legacy Megatron-LM checkpoints (`iter_N/mp_rank_TT_PPP/model_optim_rng.pt`, a folder of rank files): the
seeds are one rank file of a tiny TP=2 x PP=2 checkpoint written as the tests write it
(`tests/support/megatron_legacy.py`: torch.save of what Megatron-LM's legacy checkpointer saves), and
each case is that folder with the rank file replaced by the mutated bytes, opened as one checkpoint."""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import REPO
from .common import _torch

VICTIM = "iter_0000010/mp_rank_01_001/model_optim_rng.pt"
"""The rank file a case replaces (tensor-parallel rank 1 of the last stage)."""

_FILES: dict[str, bytes] = {}


def _support() -> Any:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import tests.support.megatron_legacy as megatron_legacy  # the tests' writer, so seeds and tests share one layout

    return megatron_legacy


def _checkpoint() -> dict[str, bytes]:
    """Every file of the seed checkpoint, relative path -> bytes (made once)."""
    if not _FILES:
        _torch()
        mls = _support()
        args = mls.args_for(2, 2, hidden_size=8, num_attention_heads=2, num_query_groups=2,
                            kv_channels=4, ffn_hidden_size=8, padded_vocab_size=16, num_layers=2)
        with tempfile.TemporaryDirectory() as d:
            root = mls.write_legacy(Path(d) / "ckpt", mls.random_mcore(args), 2, 2, args=args)
            for f in sorted(root.rglob("*")):
                if f.is_file():
                    _FILES[str(f.relative_to(root))] = f.read_bytes()
    return _FILES


def megatron_legacy_seeds() -> list[bytes]:
    """The rank file as torch.save writes it (zip), and the same checkpoint in torch's legacy (non-zip) format."""
    torch = _torch()
    zipped = _checkpoint()[VICTIM]
    checkpoint = torch.load(io.BytesIO(zipped), weights_only=False)
    legacy = io.BytesIO()
    torch.save(checkpoint, legacy, _use_new_zipfile_serialization=False)
    return [zipped, legacy.getvalue()]


@contextlib.contextmanager
def case_folder(data: bytes, path: Path | None) -> Iterator[Path]:
    """The seed checkpoint with its victim rank file holding `data` (under `path`'s folder when given)."""
    base = Path(tempfile.mkdtemp(prefix="megatron-case-", dir=None if path is None else path.parent))
    try:
        root = base / "ckpt"
        for rel, blob in _checkpoint().items():
            f = root / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data if rel == VICTIM else blob)
        yield root
    finally:
        shutil.rmtree(base, ignore_errors=True)

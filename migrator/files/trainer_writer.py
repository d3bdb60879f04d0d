"""A Hugging Face Trainer checkpoint folder written whole: the model's files, `optimizer.pt`, and the
Trainer's other files copied byte for byte.

The model is written as any folder target is (`ShardedWriter`: `model.safetensors` or shards and their
index); `optimizer.pt` is planned by the PyTorch writer from the optimizer's structure; scheduler.pt,
trainer_state.json, rng_state*.pth, training_args.bin and the config and tokenizer files are copied
from the source folder, never unpickled. All of it is published as one folder (`save_sharded`), so
`Trainer(resume_from_checkpoint=...)` finds either the old folder or the whole new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.tensor import LazyTensor
from ..formats.base import Writer
from .sharded_writer import ShardedWriter
from .trainer import OPTIMIZER_FILE


class TrainerFolderWriter(ShardedWriter):
    """The model's shards, then `optimizer.pt` (`optimizer`), then the companion files (`companions`:
    (file, name in the output), each copied unless the model's own copies or files name it already)."""

    def __init__(self, fmt: str, tensors: Sequence[LazyTensor], optimizer: Writer,
                 companions: Sequence[tuple[Path, str]], **options: Any) -> None:
        super().__init__(fmt, tensors, **options)
        self.files.append((OPTIMIZER_FILE, optimizer))
        taken = set(self.names())
        extra = [(src, name) for src, name in companions if name not in taken]
        self.copies = [*self.copies, *extra]
        self.companion_sources = [*self.companion_sources, *(src for src, _ in extra)]

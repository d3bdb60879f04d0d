"""GGUF, llama.cpp's format (`formats/gguf/`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..spec import FormatSpec, Sniff

if TYPE_CHECKING:
    from ..base import Reader

MAGIC = b"GGUF"


def whole_model(reader: Reader, path: str | None) -> None:
    """Refuse one file of a split GGUF read alone (renamed, or named out of its set): its own
    split.count says the model's other tensors are in other files, which a single-file read would
    silently leave out."""
    from ...core.errors import FormatError

    count = getattr(reader.metadata.get("split.count"), "data", None)
    if isinstance(count, int) and count > 1:
        no = getattr(reader.metadata.get("split.no"), "data", None)
        part = f"part {no + 1} of {count}" if isinstance(no, int) else f"one of {count} parts"
        raise FormatError(f"this GGUF is {part} of a split model (split.count); name the set's first file "
                          "(NAME-00001-of-NNNNN.gguf) or its folder, so that every part is read",
                          file=None if path is None else os.fspath(path))


SPEC = FormatSpec(
    name="gguf", title="GGUF", summary="GGUF (llama.cpp)", extensions=(".gguf",), recognized_by="magic GGUF",
    sniffs=(Sniff(lambda head, size: head[:4] == MAGIC),),
    reader="migrator.formats.gguf.reader:GGUFReader", writer="migrator.formats.gguf.writer:GGUFWriter",
    metadata="typed", llama_cpp=True,
    shard_names=("model{suffix}.gguf", ""),  # llama.cpp's split files: no index, always numbered
    after_open=whole_model)

"""The codec of each format name: its reader and writer class, imported from its module when first asked for."""

from __future__ import annotations

from ..core.errors import UnknownFormatError
from .base import Reader, Writer
from .detect import FORMATS


def reader_class(fmt: str) -> type[Reader]:
    if fmt == "burnpack":
        from .burnpack import BurnpackReader

        return BurnpackReader
    if fmt == "safetensors":
        from .safetensors import SafetensorsReader

        return SafetensorsReader
    if fmt == "pytorch":
        from .pytorch.reader import PytorchReader

        return PytorchReader
    if fmt == "gguf":
        from .gguf.reader import GGUFReader

        return GGUFReader
    raise UnknownFormatError(f"unknown format '{fmt}' (use one of {', '.join(FORMATS)})")


def writer_class(fmt: str) -> type[Writer]:
    if fmt == "burnpack":
        from .burnpack import BurnpackWriter

        return BurnpackWriter
    if fmt == "safetensors":
        from .safetensors import SafetensorsWriter

        return SafetensorsWriter
    if fmt == "pytorch":
        from .pytorch_writer import PytorchWriter

        return PytorchWriter
    if fmt == "gguf":
        from .gguf.writer import GGUFWriter

        return GGUFWriter
    raise UnknownFormatError(f"unknown format '{fmt}' (use one of {', '.join(FORMATS)})")

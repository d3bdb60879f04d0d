"""GGUF, llama.cpp's format: read at every ggml type (quantized ones dequantized on read), written
streamed with per-tensor quantization. See docs/gguf.md."""

from .reader import GGUFReader

__all__ = ["GGUFReader"]

"""SafeTensors (`formats/safetensors.py`)."""

from __future__ import annotations

import struct

from ..spec import FormatSpec, Sniff

# transformers 4.x refuses a SafeTensors file whose metadata exists and whose `format` is not one of
# pt, tf, flax, mlx (transformers 5 and Burn do not look), so a SafeTensors output names PyTorch's.
METADATA_FORMAT = "pt"


def _json_header(head: bytes, size: int) -> bool:
    """A u64 header length that fits the file, then JSON (`{`, or the whitespace before it)."""
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return head[8:9] in (b"{", b" ", b"\t", b"\n", b"\r") and 2 <= n <= size - 8


SPEC = FormatSpec(
    name="safetensors", title="SafeTensors", summary="SafeTensors", extensions=(".safetensors", ".st"),
    recognized_by="u64 header length + JSON", sniffs=(Sniff(_json_header, rank=1),),
    reader="migrator.formats.safetensors:SafetensorsReader", writer="migrator.formats.safetensors:SafetensorsWriter",
    metadata="text", metadata_format=METADATA_FORMAT, format_key_required=True, torch_layout=True,
    quantized_layouts=True,
    shard_names=("model{suffix}.safetensors", "model.safetensors.index.json"))

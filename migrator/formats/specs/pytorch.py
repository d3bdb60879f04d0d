"""PyTorch's `torch.save` files: zip, legacy and old tar containers (`formats/pytorch/`, written by
`formats/pytorch_writer.py`)."""

from __future__ import annotations

from ..spec import FormatSpec, Sniff

LEGACY_MAGIC = bytes.fromhex("80028a0a6cfc9c46f9206aa850192e")  # pickled magic number of the pre-1.6 stream
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


def _container(head: bytes, size: int) -> bool:
    """A zip (torch >= 1.6), the legacy stream's magic number, or a tar (`ustar` at 257)."""
    return head[:4] in ZIP_MAGICS or head.startswith(LEGACY_MAGIC) or (len(head) >= 262 and head[257:262] == b"ustar")


def _bare_pickle(head: bytes, size: int) -> bool:
    """A bare pickle (PROTO 0..5): the PyTorch reader gives the precise error."""
    return head[:1] == b"\x80" and len(head) >= 2 and head[1] <= 5


SPEC = FormatSpec(
    name="pytorch", title="PyTorch", summary="PyTorch (`torch.save`)",
    extensions=(".pt", ".pth", ".bin", ".ckpt", ".tar"),
    recognized_by="zip, tar, legacy pickle", sniffs=(Sniff(_container), Sniff(_bare_pickle, rank=2)),
    reader="migrator.formats.pytorch.reader:PytorchReader", writer="migrator.formats.pytorch_writer:PytorchWriter",
    torch_names=True, torch_layout=True, keeps_structure=True, keeps_order=True,
    shard_names=("pytorch_model{suffix}.bin", "pytorch_model.bin.index.json"))

"""PyTorch Distributed Checkpoint (DCP) folders: `.metadata` plus `__<rank>_<n>.distcp` files.

What FSDP2, torchtitan and Accelerate's `SHARDED_STATE_DICT` write (Megatron-core's `torch_dist` is this
plus its own files: `formats/torch_dist/` reads it over this reader).
`metadata` reads `.metadata` (the restricted interpreter, DCP classes only), `storage` each item's
torch.save bytes at its offset, `assemble` each global tensor from its chunks, `tree` the nested state
dict for a `.pt` target, `reader` puts them together as one `Reader`.
"""

from __future__ import annotations

from .layout import dcp_folder

__all__ = ["dcp_folder"]  # the reader: `formats.dcp.reader.DcpReader` (imported only for a DCP source)

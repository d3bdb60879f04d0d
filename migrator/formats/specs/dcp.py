"""PyTorch Distributed Checkpoint folders: read as `.metadata` and `.distcp` files or the Hugging Face
storage layout (`formats/dcp/`, `files/multi_rank.py`, `files/dcp_safetensors.py`), written as
`.metadata` + `__0_0.distcp` (`formats/dcp/writer.py`)."""

from __future__ import annotations

from ..spec import FormatSpec

SPEC = FormatSpec(
    name="dcp", title="PyTorch Distributed Checkpoint", summary="PyTorch Distributed Checkpoint (DCP)",
    recognized_by="a folder with `.metadata`", writer="migrator.formats.dcp.writer:DcpWriter", folder=True,
    torch_names=True, keeps_structure=True, optimizer_by_name=True)

"""A Megatron-core `torch_dist` checkpoint is not read yet, and is refused as that, in one line.

megatron-core 0.16 pickles torch's `SavePlan` into `.metadata`; <= 0.15 its own `MCoreMetadata`; both
write `metadata.json` and `common.pt` beside the `.distcp` files. The folders here are torch's own
`dcp.save` output with `.metadata` replaced by such a pickle (hand-built: megatron is not installed),
so the refusal names the format instead of calling the file a stranger."""

from __future__ import annotations

import json
import pickle
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from tests.support.hostile import refused

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint.planner import SavePlan  # noqa: E402

MCORE = "megatron.core.dist_checkpointing.strategies.torch"


class MCoreMetadata:
    """Pickled under megatron-core's module and name, as versions <= 0.15 write `.metadata`."""

    def __init__(self) -> None:
        self.mcore_data: dict[str, Any] = {}


def _pickle_as(module: str) -> bytes:
    """An `MCoreMetadata` pickled under `module`: dumped (protocol 2, whose GLOBAL opcode
    names the class as newline-ended text) from a stand-in module, whose name is then replaced."""
    stand_in = "mcore_stand_in"
    MCoreMetadata.__module__ = stand_in
    sys.modules[stand_in] = types.ModuleType(stand_in)
    sys.modules[stand_in].MCoreMetadata = MCoreMetadata  # type: ignore[attr-defined]
    try:
        data = pickle.dumps(MCoreMetadata(), protocol=2)
    finally:
        del sys.modules[stand_in]
    assert data.count(stand_in.encode()) == 1
    return data.replace(f"c{stand_in}\n".encode(), f"c{module}\n".encode())


def _checkpoint(folder: Path, metadata: bytes | None, *, megatron_files: bool) -> Path:
    dcp.save({"decoder.weight": torch.arange(12.0).reshape(3, 4)}, checkpoint_id=str(folder))
    if metadata is not None:
        (folder / ".metadata").write_bytes(metadata)
    if megatron_files:
        (folder / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                          "common_backend": "torch", "common_backend_version": 1}))
        torch.save({"args": None}, folder / "common.pt")
    return folder


@pytest.mark.parametrize(("metadata", "beside", "name"), [
    (lambda: pickle.dumps(SavePlan(items=[])), True, "torch.distributed.checkpoint.planner.SavePlan"),
    (lambda: pickle.dumps(SavePlan(items=[])), False, "torch.distributed.checkpoint.planner.SavePlan"),
    (lambda: _pickle_as(MCORE), True, f"{MCORE}.MCoreMetadata"),
    (lambda: _pickle_as(MCORE), False, f"{MCORE}.MCoreMetadata"),
    (lambda: _pickle_as("elsewhere"), True, "elsewhere.MCoreMetadata"),  # a stranger, Megatron's files beside it
    (lambda: pickle.dumps({"a": 1}), True, "a dict"),  # plain data, Megatron's files beside it
])
def test_megatron_torch_dist_is_refused_as_such(tmp_path: Path, metadata: Any, beside: bool, name: str) -> None:
    folder = _checkpoint(tmp_path / "ckpt", metadata(), megatron_files=beside)
    for command in (["inspect", str(folder)], ["convert", str(folder), str(tmp_path / "out.safetensors")]):
        done = refused(command, tmp_path, words=".metadata", codes=(1,))
        assert name in done.stderr and "Megatron-core torch_dist checkpoint" in done.stderr
        assert "not read yet" in done.stderr or "does not read yet" in done.stderr


def test_plain_dcp_beside_megatron_files_is_read(tmp_path: Path) -> None:
    """Megatron's files beside a `.metadata` torch wrote do not stop the folder being read."""
    from tests.support.cli import migrate_in_process

    folder = _checkpoint(tmp_path / "ckpt", None, megatron_files=True)
    done = migrate_in_process("convert", str(folder), str(tmp_path / "out.safetensors"))
    assert done.returncode == 0, done.stderr
    from safetensors.torch import load_file

    assert torch.equal(load_file(tmp_path / "out.safetensors")["decoder.weight"], torch.arange(12.0).reshape(3, 4))


def test_other_strangers_are_still_unsafe(tmp_path: Path) -> None:
    """Without Megatron's files or classes, an unknown class is refused as before."""
    folder = _checkpoint(tmp_path / "ckpt", _pickle_as("elsewhere"), megatron_files=False)
    done = refused(["inspect", str(folder)], tmp_path, words=".metadata", codes=(1,))
    assert "not a DCP metadata class" in done.stderr and "Megatron" not in done.stderr

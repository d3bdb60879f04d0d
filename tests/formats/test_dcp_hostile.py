"""Hostile PyTorch Distributed Checkpoint folders given to `migrate convert DCP out.safetensors`:
a `.metadata` pickle whose sizes, chunks, offsets, lengths, dtypes or file names lie, or that runs
code or is not a pickle at all; storage files that are truncated, missing, or whose items are
pickles that run code.

The checkpoint is written by torch's own `dcp.save` in this process (no process group: one rank),
then one thing is broken. Every case goes through the command line and is held to the same promises
(`hostile.refused`): exit 1 or 2, one line naming the file (and the tensor where there is
one), no traceback, no output or scratch file, an existing target unchanged, no code run, bounded
time and no allocation a header merely claims."""

from __future__ import annotations

import io
import os
import pickle
import shutil
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.hostile import refused

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex  # noqa: E402

FILE = "__0_0.distcp"
Change = Callable[[Path, Any], None]  # (checkpoint folder, its unpickled Metadata): edits either


class _System:
    """Unpickled by pickle or torch.load, runs `touch SENTINEL`."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.sentinel}",))


def _item(meta: Any, fqn: str) -> tuple[MetadataIndex, Any]:
    return next((k, v) for k, v in meta.storage_data.items() if k.fqn == fqn)


def storage(fqn: str, **change: Any) -> Change:
    """The storage record of `fqn`'s (first) item with fields replaced (offset, length, relative_path)."""
    def edit(folder: Path, meta: Any) -> None:
        key, info = _item(meta, fqn)
        meta.storage_data[key] = replace(info, **change)
    return edit


def tensor(fqn: str, **change: Any) -> Change:
    """`fqn`'s TensorStorageMetadata with fields replaced (size, chunks, properties)."""
    def edit(folder: Path, meta: Any) -> None:
        meta.state_dict_metadata[fqn] = replace(meta.state_dict_metadata[fqn], **change)
    return edit


def chunk(fqn: str, offsets: list[int], sizes: list[int]) -> Change:
    return tensor(fqn, chunks=[ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))])


def dtype(fqn: str, to: Any) -> Change:
    def edit(folder: Path, meta: Any) -> None:
        t = meta.state_dict_metadata[fqn]
        meta.state_dict_metadata[fqn] = replace(t, properties=replace(t.properties, dtype=to))
    return edit


def metadata_bytes(make: Callable[[Path], bytes]) -> Change:
    def edit(folder: Path, meta: Any) -> None:
        (folder / ".metadata").write_bytes(make(folder))
    return edit


def item_bytes(fqn: str, make: Callable[[Path], bytes]) -> Change:
    """Append `make(folder)` to the storage file and point `fqn`'s item at it."""
    def edit(folder: Path, meta: Any) -> None:
        data = make(folder)
        path = folder / FILE
        offset = path.stat().st_size
        with open(path, "ab") as f:
            f.write(data)
        key, info = _item(meta, fqn)
        meta.storage_data[key] = replace(info, offset=offset, length=len(data))
    return edit


def storage_file(make: Callable[[bytes], bytes | None]) -> Change:
    """The storage file's bytes replaced (None: removed)."""
    def edit(folder: Path, meta: Any) -> None:
        data = make((folder / FILE).read_bytes())
        if data is None:
            (folder / FILE).unlink()
        else:
            (folder / FILE).write_bytes(data)
    return edit


def _torch_save(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _drop_storage(fqn: str) -> Change:
    def edit(folder: Path, meta: Any) -> None:
        del meta.storage_data[_item(meta, fqn)[0]]
    return edit


def _no_chunks(folder: Path, meta: Any) -> None:
    tensor("model.w", chunks=[])(folder, meta)


def _state_dict_a_list(folder: Path, meta: Any) -> None:
    meta.state_dict_metadata = list(meta.state_dict_metadata.items())


def _storage_a_string(folder: Path, meta: Any) -> None:
    meta.storage_data = "storage"


CASES: dict[str, Change] = {
    # the .metadata pickle itself
    "metadata empty": metadata_bytes(lambda f: b""),
    "metadata random bytes": metadata_bytes(lambda f: bytes(range(256)) * 4),
    "metadata truncated": metadata_bytes(lambda f: (f / ".metadata").read_bytes()[:200]),
    "metadata runs os.system": metadata_bytes(lambda f: pickle.dumps(_System(f.parent / "ran"))),
    "metadata a dict": metadata_bytes(lambda f: pickle.dumps({"state_dict_metadata": {}})),
    "metadata a torch zip": metadata_bytes(lambda f: _torch_save({"w": torch.ones(2)})),
    "metadata memo bomb": metadata_bytes(lambda f: b"\x80\x04]\x94(" + b"h\x00" * 200_000 + b"e."),
    "state dict a list": _state_dict_a_list,
    "storage data a string": _storage_a_string,
    # sizes and chunks
    "size huge": tensor("model.w", size=torch.Size([2**40, 2**40])),
    "size beyond 64 bits": tensor("model.w", size=torch.Size([2**62, 2**62, 2**62])),
    "size negative": tensor("model.w", size=torch.Size([-3, 4])),
    "size of other rank": tensor("model.w", size=torch.Size([12])),
    "chunk huge": chunk("model.w", [0, 0], [2**31, 2**31]),
    "chunk negative offset": chunk("model.w", [-1, 0], [3, 4]),
    "chunk past the tensor": chunk("model.w", [1, 0], [3, 4]),
    "chunk of other rank": chunk("model.w", [0], [12]),
    "chunk smaller than its bytes": chunk("model.w", [0, 0], [1, 4]),
    "no chunks": _no_chunks,
    "dtype of other width": dtype("model.w", torch.float64),
    "dtype complex": dtype("model.w", torch.complex64),
    # storage records
    "storage offset past the file": storage("model.w", offset=2**40),
    "storage offset negative": storage("model.w", offset=-100),
    "storage length huge": storage("model.w", length=2**50),
    "storage length zero": storage("model.w", length=0),
    "storage file escaping": storage("model.w", relative_path="../../../../../../../etc/passwd"),
    "storage file absolute": storage("model.w", relative_path="/etc/passwd"),
    "storage file missing": storage("model.w", relative_path="__9_9.distcp"),
    "storage file a folder": storage("model.w", relative_path="."),
    "storage record missing": _drop_storage("model.w"),
    # the storage file and its items
    "storage file truncated": storage_file(lambda b: b[:2000]),
    "storage file removed": storage_file(lambda b: None),
    "storage file zeroed": storage_file(lambda b: bytes(len(b))),
    "item a pickle running os.system": item_bytes("model.w", lambda f: pickle.dumps(_System(f.parent / "ran"))),
    "item a torch zip running os.system": item_bytes("model.w", lambda f: _torch_save(_System(f.parent / "ran"))),
    "item a tensor of other shape": item_bytes("model.w", lambda f: _torch_save(torch.ones(5))),
    "item a tensor of other dtype": item_bytes("model.w", lambda f: _torch_save(torch.ones(3, 4, dtype=torch.int32))),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dcp") / "ckpt"
    state = {"model": {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(folder))
    return folder


def _broken(good: Path, tmp_path: Path, name: str) -> Path:
    folder = Path(shutil.copytree(good, tmp_path / "w" / "ckpt"))
    with open(folder / ".metadata", "rb") as f:
        meta = pickle.load(f)  # the test's own file: torch's classes are the writer here
    CASES[name](folder, meta)
    if not name.startswith("metadata "):
        with open(folder / ".metadata", "wb") as f:
            pickle.dump(meta, f)
    return folder


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_dcp_is_refused_cleanly(good: Path, tmp_path: Path, name: str) -> None:
    folder = _broken(good, tmp_path, name)
    done = refused(["convert", str(folder), str(tmp_path / "w" / "out.safetensors")], tmp_path / "w")
    assert str(folder) in done.stderr, done.stderr  # names the checkpoint's file
    assert not (tmp_path / "w" / "ran").exists()


@pytest.mark.parametrize("name", ["size huge", "storage file escaping", "item a torch zip running os.system"])
def test_an_existing_target_survives(good: Path, tmp_path: Path, name: str) -> None:
    folder = _broken(good, tmp_path, name)
    out = tmp_path / "w" / "out.pt"
    out.write_bytes(b"the old checkpoint")
    refused(["convert", str(folder), str(out), "--overwrite"], tmp_path / "w")


def test_the_good_checkpoint_converts(good: Path, tmp_path: Path) -> None:
    """The corpus's checkpoint is sound: each refusal above is the broken part's."""
    from tests.support.cli import migrate_in_process

    done = migrate_in_process("convert", str(good), str(tmp_path / "out.safetensors"))
    assert done.returncode == 0, done.stderr

"""Hostile DCP checkpoints in the Hugging Face storage layout (one SafeTensors file per rank and
shard, each tensor a chunk placed by `DCP_SHARDING_INFO`'s `saved_offsets`) given to `migrate
convert`: offsets that overlap, leave holes, run past the tensor, are negative, huge, of another
rank or not numbers; sharding info that is not JSON, not an object or nested deep; chunks of other
dtypes or widths; rank files missing, extra or misnumbered.

The set is built here as torch's `HuggingFaceStorageWriter(save_distributed=True)` lays it out
(test_dcp_hf.py reads sets two real ranks wrote): a [8, 4] tensor split by rows over two ranks, a
[4] tensor whole in rank 1's file. Every case goes through the command line and is held to the same
promises (`hostile.refused`): exit 1 or 2, one line naming the file or set, no traceback,
no output or scratch file, an existing target unchanged, bounded time.

Not a case: the last rank's file missing. The layout records no global shape nor world size (a
tensor ends where its chunks end, the file names count shards per rank), so a set without its last
rank is a smaller checkpoint, consistent as far as its files can tell."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migrator import from_numpy, save
from tests.support.hostile import refused

W = np.arange(32, dtype=np.float32).reshape(8, 4)
B = np.arange(4, dtype=np.float32)


def name(rank: int, shard: int = 1, shards: int = 1) -> str:
    return f"shard-{rank:05d}-model-{shard:05d}-of-{shards:05d}.safetensors"


def ranks(info: dict[int, Any] | None = None, tensors: dict[int, dict[str, np.ndarray]] | None = None
          ) -> Callable[[Path], None]:
    """The two rank files, with a rank's sharding info (a dict, or raw text) or tensors replaced."""
    good_tensors = {1: {"w": W[:4], "b": B}, 2: {"w": W[4:]}}
    good_info: dict[int, Any] = {1: {"w": {"saved_offsets": [0, 0]}, "b": {"saved_offsets": [0]}},
                                 2: {"w": {"saved_offsets": [4, 0]}}}

    def write(folder: Path) -> None:
        for rank in (1, 2):
            info_r = (info or {}).get(rank, good_info[rank])
            text = info_r if isinstance(info_r, str) else json.dumps(info_r)
            t = (tensors or {}).get(rank, good_tensors[rank])
            save([from_numpy(k, v) for k, v in t.items()], folder / name(rank),
                 metadata={"format": "pt", "DCP_SHARDING_INFO": text, "DCP_VERSION": "1.0"})
    return write


def offsets(rank: int, key: str, value: Any) -> Callable[[Path], None]:
    info = {1: {"w": {"saved_offsets": [0, 0]}, "b": {"saved_offsets": [0]}}, 2: {"w": {"saved_offsets": [4, 0]}}}
    info[rank][key] = {"saved_offsets": value}
    return ranks(info)


def then(first: Callable[[Path], None], change: Callable[[Path], None]) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        first(folder)
        change(folder)
    return write


CASES: dict[str, Callable[[Path], None]] = {
    "chunks overlapping": offsets(2, "w", [3, 0]),
    "a hole": offsets(2, "w", [5, 0]),
    "offset past the tensor": offsets(2, "w", [2**40, 0]),
    "offset beyond 64 bits": offsets(2, "w", [2**70, 0]),
    "offset negative": offsets(2, "w", [-4, 0]),
    "offsets of another rank": offsets(2, "w", [4]),
    "offsets strings": offsets(2, "w", ["4", "0"]),
    "offsets missing": ranks({2: {"w": {}}}),
    "offsets a float": offsets(2, "w", [4.0, 0]),
    "info not json": ranks({2: "{w: [4, 0]"}),
    "info a list": ranks({2: "[1, 2]"}),
    "info nested deep": ranks({2: "[" * 10_000 + "]" * 10_000}),
    "info NaN": ranks({2: '{"w": {"saved_offsets": [NaN, 0]}}'}),
    "chunk of other dtype": ranks(tensors={2: {"w": W[4:].astype(np.float64)}}),
    "chunk of other width": ranks(tensors={2: {"w": np.zeros((4, 5), np.float32)}}),
    "chunk of other rank": ranks(tensors={2: {"w": np.zeros(16, np.float32)}}),
    "the first rank missing": then(ranks(), lambda f: (f / name(1)).unlink()),
    "an extra rank repeating a chunk": then(ranks(), lambda f: (f / name(3)).write_bytes((f / name(2)).read_bytes())),
    "a rank file of another numbering": then(ranks(), lambda f: (f / name(2)).rename(f / name(2, 1, 2))),
    "a rank file not safetensors": then(ranks(), lambda f: (f / name(2)).write_bytes(b"\x10" + bytes(40))),
    "a rank file empty": then(ranks(), lambda f: (f / name(1)).write_bytes(b"")),
}


def _set(tmp_path: Path, case: str) -> Path:
    folder = tmp_path / "w" / "hf"
    folder.mkdir(parents=True)
    CASES[case](folder)
    return folder


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_dcp_hf_set_is_refused_cleanly(tmp_path: Path, case: str) -> None:
    folder = _set(tmp_path, case)
    done = refused(["convert", str(folder), str(tmp_path / "w" / "out.safetensors")], tmp_path / "w")
    assert str(folder) in done.stderr, done.stderr


def test_an_existing_target_survives(tmp_path: Path) -> None:
    folder = _set(tmp_path, "a hole")
    out = tmp_path / "w" / "out.safetensors"
    out.write_bytes(b"the old model")
    refused(["convert", str(folder), str(out), "--overwrite"], tmp_path / "w")


def test_the_good_set_converts(tmp_path: Path) -> None:
    """The corpus's set is sound: each refusal above is the broken part's."""
    from migrator.files.io import open_file
    from tests.support.cli import migrate_in_process

    folder = tmp_path / "hf"
    folder.mkdir()
    ranks()(folder)
    done = migrate_in_process("convert", str(folder), str(tmp_path / "out.safetensors"))
    assert done.returncode == 0, done.stderr
    with open_file(tmp_path / "out.safetensors") as r:
        assert np.array_equal(r["w"].numpy(), W) and np.array_equal(r["b"].numpy(), B)

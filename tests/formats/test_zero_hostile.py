"""Hostile DeepSpeed ZeRO checkpoint folders given to `migrate convert CKPT out.safetensors`: the
`latest` tag, the step's rank files (missing, extra, empty, not pickles, running code) and the
values inside them that the reader trusts to lay out the partitions (stage, partition counts,
param_shapes, flat fp32 groups, frozen shapes, buffer and tied names). Buffer and tied names that
name nothing are skipped, as DeepSpeed's zero_to_fp32 skips them: not refusals, not cases here.

The checkpoint is a two-rank ZeRO-1 step built here with torch.save, as DeepSpeed lays it out (two
parameters, 15 elements, one padding element: 8 per rank); test_zero_bad.py breaks checkpoints
DeepSpeed itself wrote. Every case goes through the command line and is held to the same promises
(`hostile.refused`): exit 1 or 2, one line naming the file, no traceback, no output or
scratch file, an existing target unchanged, no code run, bounded time."""

from __future__ import annotations

import os
import pickle
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.hostile import refused

torch = pytest.importorskip("torch")

STEP = "global_step1"
MODEL = "mp_rank_00_model_states.pt"
Edit = Callable[[Path, dict[str, Any], list[dict[str, Any]]], None]  # (folder, model states, optim states)


class _System:
    """Unpickled by torch.load(weights_only=False), runs `touch SENTINEL`."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.sentinel}",))


def optim_name(rank: int) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def states() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    w, b = torch.arange(12.0).reshape(4, 3), torch.ones(3)
    flat = torch.cat([w.flatten(), b, torch.zeros(1)])
    model = {"module": OrderedDict([("a.weight", w), ("a.bias", b)]), "buffer_names": [],
             "param_shapes": [OrderedDict([("a.weight", torch.Size([4, 3])), ("a.bias", torch.Size([3]))])],
             "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None,
             "dp_world_size": 2, "mp_world_size": 1, "ds_version": "0.19.8"}
    optims = [{"optimizer_state_dict": {"zero_stage": 1, "partition_count": [2], "group_paddings": [1],
                                        "single_partition_of_fp32_groups": [flat[r * 8:(r + 1) * 8].clone()],
                                        "base_optimizer_state": {"state": {}, "param_groups": []}},
               "ds_version": "0.19.8"} for r in range(2)]
    return model, optims


def write(folder: Path, edit: Edit | None = None) -> Path:
    step = folder / STEP
    step.mkdir(parents=True)
    (folder / "latest").write_text(STEP)
    model, optims = states()
    if edit is not None:
        edit(folder, model, optims)
    if model:
        torch.save(model, step / MODEL)
    for rank, optim in enumerate(optims):
        torch.save(optim, step / optim_name(rank))
    return folder


def osd(key: str, value: Any, rank: int | None = None) -> Edit:
    """optimizer_state_dict[key] = value, in every rank's file (or one)."""
    def edit(folder: Path, model: dict[str, Any], optims: list[dict[str, Any]]) -> None:
        for r, o in enumerate(optims):
            if rank is None or r == rank:
                o["optimizer_state_dict"][key] = value(r) if callable(value) else value
    return edit


def model_key(key: str, value: Any) -> Edit:
    def edit(folder: Path, model: dict[str, Any], optims: list[dict[str, Any]]) -> None:
        if value is ...:
            del model[key]
        else:
            model[key] = value(folder) if callable(value) else value
    return edit


def shapes(**named: Any) -> Edit:
    return model_key("param_shapes", [OrderedDict((k.replace("_", "."), v) for k, v in named.items())])


def after(change: Callable[[Path], None]) -> Edit:
    """Change the files once written (the folder's; `write` calls the edit before saving, so this
    registers a change on a marker the fixture runs afterwards)."""
    def edit(folder: Path, model: dict[str, Any], optims: list[dict[str, Any]]) -> None:
        _AFTER[folder] = change
    return edit


_AFTER: dict[Path, Callable[[Path], None]] = {}


def _write_bytes(name: str, data: Callable[[Path], bytes]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / STEP / name).write_bytes(data(folder))
    return change


def _truncate(name: str, keep: float) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        path = folder / STEP / name
        os.truncate(path, int(path.stat().st_size * keep))
    return change


def _latest(text: bytes) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / "latest").write_bytes(text)
    return change


def _remove(name: str) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / STEP / name).unlink()
    return change


def _copy(name: str, to: str) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / STEP / to).write_bytes((folder / STEP / name).read_bytes())
    return change


def _one_rank(folder: Path, model: dict[str, Any], optims: list[dict[str, Any]]) -> None:
    del optims[1]


CASES: dict[str, Edit] = {
    # the optimizer states' layout values
    "zero_stage a string": osd("zero_stage", "1"),
    "zero_stage 7": osd("zero_stage", 7),
    "zero_stage huge": osd("zero_stage", 2**70),
    "zero_stage an object": osd("zero_stage", ...),
    "partition_count huge": osd("partition_count", [2**40]),
    "partition_count zero": osd("partition_count", [0]),
    "partition_count negative": osd("partition_count", -2),
    "partition_count a string": osd("partition_count", "2"),
    "partition_count other than the ranks": osd("partition_count", [3]),
    "fp32 groups missing": osd("single_partition_of_fp32_groups", ...),
    "fp32 groups a tensor": osd("single_partition_of_fp32_groups", lambda r: torch.zeros(8)),
    "fp32 groups empty": osd("single_partition_of_fp32_groups", []),
    "fp32 groups of integers": osd("single_partition_of_fp32_groups", lambda r: [torch.zeros(8, dtype=torch.int32)]),
    "fp32 groups two-d": osd("single_partition_of_fp32_groups", lambda r: [torch.zeros(2, 4)]),
    "fp32 group short": osd("single_partition_of_fp32_groups", lambda r: [torch.zeros(5)], rank=1),
    "fp32 group long": osd("single_partition_of_fp32_groups", lambda r: [torch.zeros(4000)]),
    "fp32 groups one too many": osd("single_partition_of_fp32_groups", lambda r: [torch.zeros(8), torch.zeros(8)]),
    "fp32 group strings": osd("single_partition_of_fp32_groups", ["a"]),
    "optimizer_state_dict a list": lambda f, m, o: o[0].update(optimizer_state_dict=[1]),
    "optimizer_state_dict runs os.system": lambda f, m, o: o[0].update(optimizer_state_dict=_System(f / "ran")),
    # the model states' names and shapes
    "param_shapes missing": model_key("param_shapes", ...),
    "param_shapes empty": model_key("param_shapes", []),
    "param_shapes a dict of strings": model_key("param_shapes", [{"a.weight": "4x3"}]),
    "param_shapes huge": shapes(a_weight=torch.Size([2**40, 2**40]), a_bias=torch.Size([3])),
    "param_shapes beyond 64 bits": shapes(a_weight=[2**70], a_bias=torch.Size([3])),
    "param_shapes negative": shapes(a_weight=torch.Size([-4, 3]), a_bias=torch.Size([3])),
    "param_shapes too few elements": shapes(a_weight=torch.Size([2, 3]), a_bias=torch.Size([3])),
    "param_shapes too many elements": shapes(a_weight=torch.Size([9, 3]), a_bias=torch.Size([3])),
    "param_shapes a float": shapes(a_weight=[4.5, 3], a_bias=torch.Size([3])),
    "param_shapes runs os.system": model_key("param_shapes", lambda f: _System(f / "ran")),
    "buffer_names a string": model_key("buffer_names", "scale"),
    "frozen shapes without fragments": model_key("frozen_param_shapes", OrderedDict(f=torch.Size([3]))),
    # the files
    "model states missing": lambda f, m, o: m.clear(),
    "a rank missing": _one_rank,
    "an extra rank": after(_copy(optim_name(1), optim_name(2))),
    "optim states empty": after(_write_bytes(optim_name(0), lambda f: b"")),
    "optim states random bytes": after(_write_bytes(optim_name(1), lambda f: bytes(range(256)) * 8)),
    "optim states truncated": after(_truncate(optim_name(1), 0.6)),
    "model states truncated": after(_truncate(MODEL, 0.5)),
    "optim states a bare pickle running os.system":
        after(_write_bytes(optim_name(0), lambda f: pickle.dumps({"optimizer_state_dict": _System(f / "ran")}))),
    "latest naming no step": after(_latest(b"global_step9")),
    "latest escaping": after(_latest(b"../../../../../../etc")),
    "latest absolute": after(_latest(b"/etc")),
    "latest empty": after(_latest(b"")),
    "latest huge": after(_latest(b"global_step1" * 100_000)),
    "latest not utf-8": after(_latest(b"\xff\xfe")),
    "latest with a NUL": after(_latest(b"global_step1\x00x")),
    "step without optimizer states": after(lambda f: [_remove(optim_name(r))(f) for r in range(2)] and None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_zero_checkpoint_is_refused_cleanly(tmp_path: Path, name: str) -> None:
    folder = write(tmp_path / "w" / "ckpt", CASES[name])
    if folder in _AFTER:
        _AFTER.pop(folder)(folder)
    done = refused(["convert", str(folder), str(tmp_path / "w" / "out.safetensors")], tmp_path / "w")
    assert str(folder) in done.stderr, done.stderr  # names the checkpoint or its file
    assert not (tmp_path / "w" / "ran").exists()


@pytest.mark.parametrize("name", ["partition_count huge", "param_shapes huge", "latest escaping"])
def test_an_existing_target_survives(tmp_path: Path, name: str) -> None:
    folder = write(tmp_path / "w" / "ckpt", CASES[name])
    if folder in _AFTER:
        _AFTER.pop(folder)(folder)
    out = tmp_path / "w" / "out.safetensors"
    out.write_bytes(b"the old model")
    refused(["convert", str(folder), str(out), "--overwrite"], tmp_path / "w")


def test_the_good_checkpoint_converts(tmp_path: Path) -> None:
    """The corpus's checkpoint is sound: each refusal above is the broken part's."""
    import numpy as np

    from migrator.files.io import open_file
    from tests.support.cli import migrate_in_process

    folder = write(tmp_path / "ckpt")
    done = migrate_in_process("convert", str(folder), str(tmp_path / "out.safetensors"))
    assert done.returncode == 0, done.stderr
    with open_file(tmp_path / "out.safetensors") as r:
        assert np.array_equal(r["a.weight"].numpy(), np.arange(12.0, dtype=np.float32).reshape(4, 3))
        assert np.array_equal(r["a.bias"].numpy(), np.ones(3, np.float32))

"""Hostile PEFT adapter folders given to `migrate convert BASE OUT --lora ADAPTER`: broken
`adapter_config.json` values (types, ranks, scales, patterns, features), adapter tensors whose names,
shapes, ranks or dtypes do not fit the base, weights files that are truncated, missing or run code.

Every case goes through the command line and is held to the same promises
(`hostile.refused`): exit 1 or 2, one line naming the adapter file (or the tensor), no
traceback, no output or scratch file, an existing target unchanged, bounded time."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migrator import from_numpy, save
from tests.support.hostile import refused

HIDDEN, R = 16, 2
PREFIX = "base_model.model.model.layers.0.self_attn."
GOOD_CONFIG: dict[str, Any] = {"peft_type": "LORA", "r": R, "lora_alpha": 4, "target_modules": ["q_proj"],
                               "bias": "none", "task_type": "CAUSAL_LM"}


def good_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {PREFIX + "q_proj.lora_A.weight": rng.standard_normal((R, HIDDEN)).astype(np.float32),
            PREFIX + "q_proj.lora_B.weight": rng.standard_normal((HIDDEN, R)).astype(np.float32)}


def config(**change: Any) -> Callable[[Path], None]:
    """adapter_config.json with keys changed (a value of `...` removes the key)."""
    def write(folder: Path) -> None:
        doc = {k: v for k, v in {**GOOD_CONFIG, **change}.items() if v is not ...}
        (folder / "adapter_config.json").write_text(json.dumps(doc))
    return write


def config_text(text: str | bytes) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        (folder / "adapter_config.json").write_bytes(text.encode() if isinstance(text, str) else text)
    return write


def tensors(change: Callable[[dict[str, np.ndarray]], None]) -> Callable[[Path], None]:
    """adapter_model.safetensors with the good tensors changed by `change`."""
    def write(folder: Path) -> None:
        t = good_tensors()
        change(t)
        (folder / "adapter_model.safetensors").unlink()
        save([from_numpy(k, v) for k, v in t.items()], folder / "adapter_model.safetensors")
    return write


def weights_bytes(name: str, raw: Callable[[Path], bytes]) -> Callable[[Path], None]:
    """Replace the weights file by `name` holding `raw(folder)`."""
    def write(folder: Path) -> None:
        data = raw(folder)
        (folder / "adapter_model.safetensors").unlink()
        (folder / name).write_bytes(data)
    return write


class _System:
    """A pickle whose loading would run `touch SENTINEL`."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.sentinel}",))


def _set(key: str, value: Any) -> Callable[[dict[str, np.ndarray]], None]:
    def change(t: dict[str, np.ndarray]) -> None:
        t[PREFIX + key] = value
    return change


def _drop(key: str) -> Callable[[dict[str, np.ndarray]], None]:
    def change(t: dict[str, np.ndarray]) -> None:
        del t[PREFIX + key]
    return change


def _both(*writes: Callable[[Path], None]) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        for w in writes:
            w(folder)
    return write


CASES: dict[str, Callable[[Path], None]] = {
    "config not json": config_text("{peft_type: LORA"),
    "config empty": config_text(""),
    "config a list": config_text("[1]"),
    "config nested deep": config_text("[" * 100_000 + "]" * 100_000),
    "config not utf-8": config_text(b'{"peft_type": "\xff"}'),
    "config integer of 5000 digits": config_text('{"peft_type": "LORA", "r": ' + "9" * 5000 + "}"),
    "peft_type missing": config(peft_type=...),
    "peft_type IA3": config(peft_type="IA3"),
    "peft_type a list": config(peft_type=["LORA"]),
    "bias all": config(bias="all"),
    "r zero": config(r=0),
    "r negative": config(r=-2),
    "r a string": config(r="2"),
    "r a float": config(r=2.0),
    "r true": config(r=True),
    "r huge": config(r=2**62),
    "r disagrees with lora_A": config(r=3),
    "lora_alpha NaN": config(lora_alpha=float("nan")),
    "lora_alpha infinite": config(lora_alpha=float("inf")),
    "lora_alpha beyond float32": config(lora_alpha=1e39),
    "lora_alpha a string": config(lora_alpha="4"),
    "lora_alpha missing": config(lora_alpha=...),
    "rank_pattern a list": config(rank_pattern=["q_proj"]),
    "rank_pattern rank zero": config(rank_pattern={"q_proj": 0}),
    "rank_pattern rank float": config(rank_pattern={"q_proj": 2.5}),
    "rank_pattern bad regex": config(rank_pattern={"(q_proj": 2}),
    "rank_pattern disagrees": config(rank_pattern={"q_proj": 4}),
    "alpha_pattern NaN": config(alpha_pattern={"q_proj": float("nan")}),
    "alpha_pattern beyond float32": config(alpha_pattern={"q_proj": -1e300}),
    "alpha_pattern bad regex": config(alpha_pattern={"[": 1}),
    "layer_replication set": config(layer_replication=[[0, 1]]),
    "use_dora without magnitudes": config(use_dora=True),
    "modules_to_save a number": config(modules_to_save=7),
    "lora_A wrong rank": tensors(_set("q_proj.lora_A.weight", np.zeros((3, HIDDEN), np.float32))),
    "lora_A wrong width": tensors(_set("q_proj.lora_A.weight", np.zeros((R, HIDDEN + 1), np.float32))),
    "lora_B wrong height": tensors(_set("q_proj.lora_B.weight", np.zeros((HIDDEN * 4, R), np.float32))),
    "lora_A three-d": tensors(_set("q_proj.lora_A.weight", np.zeros((R, HIDDEN, 1), np.float32))),
    "lora_A one-d": tensors(_set("q_proj.lora_A.weight", np.zeros(R * HIDDEN, np.float32))),
    "lora_A integers": tensors(_set("q_proj.lora_A.weight", np.zeros((R, HIDDEN), np.int32))),
    "lora_B missing": tensors(_drop("q_proj.lora_B.weight")),
    "two lora_A": tensors(_set("q_proj.lora_A.other.weight", np.zeros((R, HIDDEN), np.float32))),
    "module not in the base": tensors(_set("nothing.lora_A.weight", np.zeros((R, HIDDEN), np.float32))),
    "unknown lora tensor": tensors(_set("q_proj.lora_C.weight", np.zeros((R, HIDDEN), np.float32))),
    "modules_to_save of another shape": tensors(_set("q_proj.modules_to_save.default.weight",
                                                     np.zeros((3, 3), np.float32))),
    "dora magnitude of other length": _both(config(use_dora=True),
                                            tensors(_set("q_proj.lora_magnitude_vector.weight",
                                                         np.ones(HIDDEN + 1, np.float32)))),
    "dora magnitude without use_dora": tensors(_set("q_proj.lora_magnitude_vector.weight",
                                                    np.ones(HIDDEN, np.float32))),
    "embedding lora on a linear": tensors(_set("q_proj.lora_embedding_A.weight", np.zeros((R, HIDDEN), np.float32))),
    "base layer copy of other shape": tensors(_set("q_proj.base_layer.weight", np.zeros((3, 3), np.float32))),
    "weights truncated": weights_bytes("adapter_model.safetensors",
                                       lambda f: (f.parent / "good" / "adapter" / "adapter_model.safetensors")
                                       .read_bytes()[:100]),
    "weights header huge": weights_bytes("adapter_model.safetensors", lambda f: (2**60).to_bytes(8, "little") + b"{}"),
    "weights not a model": weights_bytes("adapter_model.safetensors", lambda f: b"hello world, not tensors"),
    "weights none": weights_bytes("adapter_model.txt", lambda f: b""),
    "bin runs os.system": weights_bytes("adapter_model.bin", lambda f: pickle.dumps(_System(f.parent / "ran"))),
    "bin random bytes": weights_bytes("adapter_model.bin", lambda f: np.random.default_rng(5).bytes(3000)),
}


def hf_base(folder: Path) -> Path:
    """A base folder (no torch): config.json and the q/k projections of one layer."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    save([from_numpy(f"model.layers.0.self_attn.{k}.weight", rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32))
          for k in ("q_proj", "k_proj")], folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": HIDDEN}))
    return folder


@pytest.fixture
def case_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """(base, good adapter) under tmp_path/good; each case copies the adapter to tmp_path/adapter."""
    base = hf_base(tmp_path / "good" / "base")
    adapter = tmp_path / "good" / "adapter"
    adapter.mkdir()
    config()(adapter)
    save([from_numpy(k, v) for k, v in good_tensors().items()], adapter / "adapter_model.safetensors")
    return base, adapter


def _adapter(tmp_path: Path, good: Path, name: str) -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir()
    for p in good.iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    CASES[name](folder)
    return folder


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_adapter_is_refused_cleanly(case_dirs: tuple[Path, Path], tmp_path: Path, name: str) -> None:
    base, good = case_dirs
    adapter = _adapter(tmp_path, good, name)
    done = refused(["convert", str(base), str(tmp_path / "out.safetensors"), "--lora", str(adapter)], tmp_path)
    assert str(adapter) in done.stderr or PREFIX in done.stderr, done.stderr  # the adapter's file or tensor
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("target", ["out.safetensors", "out/"])
def test_an_existing_target_survives(case_dirs: tuple[Path, Path], tmp_path: Path, target: str) -> None:
    base, good = case_dirs
    adapter = _adapter(tmp_path, good, "lora_A wrong rank")
    out = tmp_path / target
    if target.endswith("/"):
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"old")
    else:
        out.write_bytes(b"old")
    refused(["convert", str(base), str(tmp_path / target), "--lora", str(adapter), "--overwrite"], tmp_path)


@pytest.mark.parametrize(("args", "words"), [
    (["--lora-scale", "nan"], "--lora-scale"),
    (["--lora-scale", "1e39"], "--lora-scale"),
    (["--lora", "missing-adapter"], "missing-adapter"),
])
def test_bad_lora_options_are_usage_errors(case_dirs: tuple[Path, Path], tmp_path: Path, args: list[str],
                                           words: str, monkeypatch: pytest.MonkeyPatch) -> None:
    base, good = case_dirs
    monkeypatch.chdir(tmp_path)  # 'missing-adapter' is relative
    extra = args if "--lora" in args else ["--lora", str(good), *args]
    refused(["convert", str(base), str(tmp_path / "out.safetensors"), *extra], tmp_path, words=words)


def test_a_backtracking_pattern_is_matched_in_bounded_time(case_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    """rank_pattern keys are regexes from the file: catastrophic ones match no module here, quickly."""
    from tests.support.alarm import alarm
    from tests.support.cli import migrate_in_process

    base, good = case_dirs
    adapter = _adapter(tmp_path, good, "r disagrees with lora_A")  # its config is rewritten whole below
    config(rank_pattern={"(a+)+$": 2, "(.*)*x": 2, "(x+x+)+y": 2})(adapter)
    with alarm(20, "a backtracking rank_pattern ran past 20 s"):
        done = migrate_in_process("convert", str(base), str(tmp_path / "out.safetensors"), "--lora", str(adapter))
    assert done.returncode == 0, done.stderr


def test_the_good_adapter_folds(case_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    """The corpus's base and adapter are sound: each refusal above is the broken part's."""
    from tests.support.cli import migrate_in_process

    base, good = case_dirs
    done = migrate_in_process("convert", str(base), str(tmp_path / "out.safetensors"), "--lora", str(good))
    assert done.returncode == 0, done.stderr

"""Training checkpoints: weights beside arbitrary Python objects (issue 20 item 2).

fairseq, PyTorch Lightning, timm and DeepSpeed save the weights next to `args`, configs, callbacks
and loop state. Those objects are inert placeholders in migrator: their classes are never imported,
called or built (sentinel classes below would write a file or set a global if they ran), the weights
under the selected key load equal to torch.load's, and each placeholder is named by `inspect`.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import enum
import json
import os
import pathlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import migrator
from migrator.analysis.inspect import inspect_file
from migrator.core.errors import UnsafePickleError
from migrator.formats import safepickle as sp

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
RAN: list[str] = []  # the sentinel classes append here (and write a file) if any of their code runs


def _side_effect(path: str) -> None:
    RAN.append(path)
    Path(path).write_text("ran")


class SetstateSentinel:
    def __init__(self, path: str) -> None:
        self.path = path

    def __setstate__(self, state: dict[str, Any]) -> None:  # pragma: no cover - must never run
        _side_effect(state["path"])


class ReduceSentinel:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return _side_effect, (self.path,)  # unpickling calls _side_effect(path)


class InitSentinel:
    def __init__(self, path: str, armed: bool = False) -> None:
        self.path = path
        if armed:  # pragma: no cover - must never run
            _side_effect(path)

    def __reduce__(self) -> Any:
        return InitSentinel, (self.path, True)  # unpickling calls InitSentinel(path, armed=True)


@dataclasses.dataclass
class TrainConfig:
    lr: float = 1e-3
    layers: tuple[int, ...] = (2, 3)


class Phase(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 2)


def _weights() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"enc.weight": torch.randn(4, 3, generator=g), "enc.bias": torch.randn(4, generator=g),
            "head.weight": torch.randn(2, 4, generator=g).half()}


def _sentinels(tmp: Path) -> dict[str, Any]:
    return {"setstate": SetstateSentinel(str(tmp / "setstate")), "reduce": ReduceSentinel(str(tmp / "reduce")),
            "init": InitSentinel(str(tmp / "init"))}


def lightning_style(tmp: Path) -> tuple[dict[str, Any], str]:
    """What pytorch_lightning's Trainer.save_checkpoint writes, with objects of the kinds it holds."""
    ckpt = {
        "epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.4.0",
        "state_dict": _weights(),
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 3}}, "phase": Phase.TRAIN}},
        "callbacks": {"ModelCheckpoint{'monitor': 'val_loss'}": {"best_model_path": pathlib.Path("/ckpt/best.ckpt"),
                                                                "best_model_score": torch.tensor(0.25)},
                      "sentinels": _sentinels(tmp)},
        "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}],
        "lr_schedulers": [{"last_epoch": np.int64(3), "base_lrs": [np.float32(0.1)]}],
        "hyper_parameters": {"cfg": TrainConfig(), "phase": Phase.EVAL, "counts": collections.defaultdict(int, a=1),
                             "seed": np.int64(7), "scale": np.float64(0.5)},
    }
    return ckpt, "state_dict"


def fairseq_style(tmp: Path) -> tuple[dict[str, Any], str]:
    """What fairseq's checkpoint_utils.save_state writes: model, args (a Namespace), cfg, extra state."""
    ns = argparse.Namespace(arch="transformer", lr=[0.0005], save_dir=pathlib.Path("/ckpt"),
                            sentinel=InitSentinel(str(tmp / "init-in-args")))  # state of a placeholder: dropped
    ckpt = {
        "args": ns, "cfg": {"model": ns, "common": TrainConfig()},
        "model": _weights(),
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "num_updates": 10}],
        "extra_state": {"train_iterator": {"epoch": 1}, "val_loss": np.float32(3.5), "sentinels": _sentinels(tmp),
                        "metrics": collections.defaultdict(list)},
        "last_optimizer_state": None,
    }
    return ckpt, "model"


STYLES = {"lightning": lightning_style, "fairseq": fairseq_style}


SENTINEL_CLASSES = {f"{__name__}.{n}" for n in ("SetstateSentinel", "InitSentinel", "_side_effect")}


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("style", list(STYLES))
def test_training_checkpoint_weights_load_and_nothing_runs(tmp_path: Path, style: str, legacy: bool) -> None:
    ckpt, key = STYLES[style](tmp_path)
    path = tmp_path / f"{style}.ckpt"
    torch.save(ckpt, path, _use_new_zipfile_serialization=not legacy)
    expected = torch.load(path, weights_only=False)[key]  # the oracle (it runs the sentinels: clear after)
    live = {p.name for p in tmp_path.iterdir()} - {path.name}
    assert live >= {"setstate", "reduce", "init"}, "the sentinels are live"
    for name in live:
        (tmp_path / name).unlink()
    RAN.clear()
    with migrator.open_file(path, top_level_key=key) as r:
        got = {t.name: t.numpy() for t in r.tensors}
        assert got.keys() == expected.keys()
        for name, t in expected.items():
            assert got[name].dtype == t.numpy().dtype and np.array_equal(got[name], t.numpy()), name
        found = {p["class"] for p in r.extra()["placeholders"]}
    assert not RAN and {p.name for p in tmp_path.iterdir()} == {path.name}
    assert found >= SENTINEL_CLASSES


def test_each_placeholder_is_named_in_inspect(tmp_path: Path) -> None:
    ckpt, key = lightning_style(tmp_path)
    path = tmp_path / "lightning.ckpt"
    torch.save(ckpt, path)
    info = inspect_file(path, top_level_key=key)
    shown = {(p["key"], p["class"]) for p in info["details"]["placeholders"]}
    mod = __name__
    for expected in [("loops.fit_loop.phase", f"{mod}.Phase"),
                     ("callbacks.ModelCheckpoint{'monitor': 'val_loss'}.best_model_path", "pathlib.PosixPath"),
                     ("callbacks.sentinels.setstate", f"{mod}.SetstateSentinel"),
                     ("callbacks.sentinels.reduce", f"{mod}._side_effect"),
                     ("callbacks.sentinels.init", f"{mod}.InitSentinel"),
                     ("hyper_parameters.cfg", f"{mod}.TrainConfig"),
                     ("hyper_parameters.phase", f"{mod}.Phase")]:
        assert expected in shown, (expected, shown)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{Path(__file__).resolve().parents[1]}"}
    for args in (["--json"], []):
        out = subprocess.run([sys.executable, "-m", "migrator.cli", "inspect", *args, str(path),
                              "--top-level-key", key], capture_output=True, text=True, env=env, check=True).stdout
        if args:
            assert {(p["key"], p["class"]) for p in json.loads(out)["details"]["placeholders"]} == shown
        else:
            for k, cls in shown:
                assert cls in out and k.rsplit(".", 1)[-1][:20] in out, (k, cls)


def test_a_placeholder_inside_the_selection_names_its_key_path(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save({"model": {"w": torch.ones(2), "head": TrainConfig()}, "args": argparse.Namespace(a=1)}, path)
    with pytest.raises(UnsafePickleError, match=rf"model\.head: a '{__name__}\.TrainConfig' object") as e:
        migrator.open_file(path, top_level_key="model")
    assert not isinstance(e.value, sp.WholeModelPickleError)
    # without a key: the error names the keys that hold tensors, so the user can pick one
    torch.save({"args": argparse.Namespace(a=1), "model": {"w": torch.ones(2)}, "step": 3,
                "ema": [torch.zeros(1)]}, path)
    with pytest.raises(UnsafePickleError, match=r"args: a 'argparse\.Namespace' object.*tensors are 'model', 'ema'"):
        migrator.open_file(path)


def test_a_pickled_module_keeps_the_whole_model_advice(tmp_path: Path) -> None:
    for legacy in (False, True):
        path = tmp_path / f"m{legacy}.pt"
        torch.save({"model": _weights(), "net": Head()}, path, _use_new_zipfile_serialization=not legacy)
        with migrator.open_file(path, top_level_key="model") as r:  # the module beside the weights: fine
            assert sorted(t.name for t in r.tensors) == sorted(_weights())
        with pytest.raises(sp.WholeModelPickleError, match=r"net: a '.*Head' .*state_dict\(\)"):
            migrator.open_file(path)
        torch.save(Head(), path, _use_new_zipfile_serialization=not legacy)
        with pytest.raises(sp.WholeModelPickleError, match=r"Head.*state_dict\(\)"):
            migrator.open_file(path)


def test_code_running_globals_are_still_refused_when_called() -> None:
    for payload in (b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00true\x85R.",
                    b"\x80\x02csubprocess\nPopen\nX\x04\x00\x00\x00true\x85\x81.",
                    b"\x80\x02ctorch.serialization\nload\nX\x01\x00\x00\x00x\x85R."):
        with pytest.raises(UnsafePickleError, match="refusing to call"):
            sp.load(payload)
    # a placeholder is data: calling it is refused too
    with pytest.raises(UnsafePickleError, match=r"refusing to call a 'm\.C' object"):
        sp.load(b"\x80\x02cm\nC\n)\x81)R.")

"""A training checkpoint's optimizer state is never written as weights, or left out, without a word.

Checkpoints are torch's own: `torch.distributed.checkpoint.save` of `get_state_dict`'s model and
optimizer (one process), and a `torch.save` of `{"model", "optimizer", "epoch"}`. The counts the
messages give are torch's (tensors in the optimizer's `state`), the weights written are compared with
the model's own `state_dict()`."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process as migrate

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from safetensors.torch import load_file  # noqa: E402


def _trained() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def _state_tensors(optimizer_state: dict[Any, Any]) -> int:
    return sum(torch.is_tensor(v) for s in optimizer_state["state"].values() for v in s.values())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any, int]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = tmp_path_factory.mktemp("ckpt")
    model, opt = _trained()
    msd, osd = get_state_dict(model, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: one rank
        dcp.save({"model": msd, "optim": osd, "step": 3}, checkpoint_id=str(folder / "dcp"))
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, folder / "train.pt")
    return folder / "dcp", folder / "train.pt", model.state_dict(), _state_tensors(opt.state_dict())


@pytest.mark.parametrize("source", ["dcp", "pt"])
def test_a_model_folder_target_refuses_the_optimizer_as_weights(checkpoints: tuple[Path, Path, Any, int],
                                                               tmp_path: Path, source: str) -> None:
    ckpt = checkpoints[0] if source == "dcp" else checkpoints[1]
    out = tmp_path / "out"
    done = migrate("convert", str(ckpt), str(out) + "/", "--max-shard-size", "1GB")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    owner = "optim" if source == "dcp" else "optimizer"
    assert f"{checkpoints[3]} tensors of optimizer state ('{owner}')" in done.stderr
    assert "--top-level-key model" in done.stderr and not out.exists()


def test_dcp_to_a_folder_without_a_key_is_refused(checkpoints: tuple[Path, Path, Any, int], tmp_path: Path) -> None:
    """The case a user met: `convert DCP out/` wrote model and optimizer into model.safetensors, exit 0."""
    done = migrate("convert", str(checkpoints[0]), str(tmp_path / "out") + "/")
    assert done.returncode == 1 and "--top-level-key model" in done.stderr
    assert not (tmp_path / "out").exists()
    done = migrate("convert", str(checkpoints[0]), str(tmp_path / "out") + "/", "--top-level-key", "model")
    assert done.returncode == 0, done.stderr
    got, want = load_file(tmp_path / "out" / "model.safetensors"), checkpoints[2]
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("source", ["dcp", "pt"])
def test_one_file_says_the_optimizer_is_written_as_weights(checkpoints: tuple[Path, Path, Any, int],
                                                           tmp_path: Path, source: str) -> None:
    ckpt = checkpoints[0] if source == "dcp" else checkpoints[1]
    done = migrate("convert", str(ckpt), str(tmp_path / "all.safetensors"))
    assert done.returncode == 0, done.stderr
    assert f"note: {checkpoints[3]} tensors of optimizer state" in done.stdout
    assert "--top-level-key model" in done.stdout
    assert len(load_file(tmp_path / "all.safetensors")) == len(checkpoints[2]) + checkpoints[3]


@pytest.mark.parametrize("source", ["dcp", "pt"])
@pytest.mark.parametrize("target", ["m.safetensors", "m.bpk"])
def test_top_level_key_says_the_optimizer_is_left_out(checkpoints: tuple[Path, Path, Any, int], tmp_path: Path,
                                                      source: str, target: str) -> None:
    ckpt = checkpoints[0] if source == "dcp" else checkpoints[1]
    done = migrate("convert", str(ckpt), str(tmp_path / target), "--top-level-key", "model")
    assert done.returncode == 0, done.stderr
    owner = "optim" if source == "dcp" else "optimizer"
    assert f"top_level_key 'model': the optimizer state beside it ('{owner}') is left out" in done.stdout
    if target.endswith(".safetensors"):
        got, want = load_file(tmp_path / target), checkpoints[2]
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_a_model_alone_gets_no_note(checkpoints: tuple[Path, Path, Any, int], tmp_path: Path) -> None:
    torch.save(checkpoints[2], tmp_path / "model.pt")
    done = migrate("convert", str(tmp_path / "model.pt"), str(tmp_path / "m.safetensors"))
    assert done.returncode == 0 and "optimizer" not in done.stdout, done.stdout
    torch.save({"model": checkpoints[2], "epoch": 1}, tmp_path / "wrapped.pt")
    done = migrate("convert", str(tmp_path / "wrapped.pt"), str(tmp_path / "w.safetensors"), "--top-level-key", "model")
    assert done.returncode == 0 and "optimizer" not in done.stdout, done.stdout

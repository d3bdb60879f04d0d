"""`--executor ray` on a local Ray (started once for the module; Ray start-up is slow): the same
bytes as a serial run, a failed task publishes nothing, a killed worker's task is retried."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from migrator.cli import main

ray = pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO) + (os.pathsep + old if old else "")  # the workers import migrator
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(48 + 8 * i, 56 + 8 * i) for i in range(6)])
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(sd, tmp_path / "ckpt.pt")
    for name, target in (("file.yaml", "model.bpk"), ("st.yaml", "model.safetensors"),
                         ("shards.yaml", "shards/, shard: {max_size: 20KB}, format: safetensors")):
        (tmp_path / name).write_text("version: 1\nsource: {path: ckpt.pt}\nadapters: [pytorch_to_burn]\n"
                                     f"dtype: {{cast: F16}}\ntarget: {{path: {target}}}\n")
    return tmp_path, sd


def _run(folder: Path, *args: str) -> int:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return main(["run", *args, "--no-progress"])
    finally:
        os.chdir(cwd)


def _files(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_ray_jobs_and_write_tasks_give_the_serial_bytes(local_ray: None, models: tuple[Path, dict[str, torch.Tensor]],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder, sd = models
    for recipe, target in (("file.yaml", "model.bpk"), ("shards.yaml", "shards")):
        assert _run(folder, recipe, "--target", f"serial-{target}") == 0
        assert _run(folder, recipe, "--target", f"ray-{target}", "--executor", "ray", "--workers", "2") == 0
        assert _files(folder / f"ray-{target}") == _files(folder / f"serial-{target}")
    assert len(_files(folder / "ray-shards")) > 3
    # several recipes: one Ray task each
    assert _run(folder, "file.yaml", "st.yaml", "--executor", "ray", "--report", "all.json") == 0
    assert (folder / "model.bpk").read_bytes() == (folder / "serial-model.bpk").read_bytes()
    assert [j["status"] for j in json.loads((folder / "all.json").read_text())["jobs"]] == ["ok", "ok"]
    got = load_file(str(folder / "model.safetensors"))  # the safetensors library reads it: torch's values
    for k, v in sd.items():
        np.testing.assert_array_equal(got[k], (v.t() if k.endswith("weight") else v).half().numpy(), err_msg=k)
    capsys.readouterr()


@pytest.mark.parametrize("target", ["model.bpk", "shards"])
def test_a_failed_ray_task_is_a_clear_error_and_publishes_nothing(
        local_ray: None, models: tuple[Path, dict[str, torch.Tensor]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], target: str) -> None:
    folder, _ = models
    monkeypatch.setenv("MIGRATOR_TEST_FAULT", json.dumps({"kind": "raise", "task": 1}))
    recipe = "file.yaml" if target == "model.bpk" else "shards.yaml"
    assert _run(folder, recipe, "--executor", "ray", "--workers", "2") == 1
    err = capsys.readouterr().err
    assert "write task 1" in err and "injected failure" in err and "nothing written" in err
    assert not (folder / target).exists()
    assert not [n for n in os.listdir(folder) if ".migrator-" in n]


def test_a_killed_worker_is_retried_and_the_output_is_whole(local_ray: None,
                                                            models: tuple[Path, dict[str, torch.Tensor]],
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder, _ = models
    marker = folder / "killed-once"
    # task 0 kills its own worker process (SIGKILL) after writing its first tensor, on its first attempt
    monkeypatch.setenv("MIGRATOR_TEST_FAULT", json.dumps({"kind": "kill", "task": 0, "marker": str(marker)}))
    assert _run(folder, "file.yaml", "--target", "ray.bpk", "--executor", "ray", "--workers", "2") == 0
    assert marker.exists()  # the first attempt died
    monkeypatch.delenv("MIGRATOR_TEST_FAULT")
    assert _run(folder, "file.yaml", "--target", "serial.bpk") == 0
    assert (folder / "ray.bpk").read_bytes() == (folder / "serial.bpk").read_bytes()
    capsys.readouterr()

"""`--executor ray` on a local Ray (started once for the module; Ray start-up is slow): the same
bytes as a serial run, a failed task publishes nothing, a killed worker's task is retried."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from migrator.cli import main

ray = pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[2]


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


def test_ray_jobs_read_the_config_beside_their_source(local_ray: None, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A shipped `${config}` recipe on the user's models through Ray: write tasks of one run (`--source`,
    `--workers`), and one Ray task per `--each` job; each takes the head counts from its own model's
    config, not from the example's beside the recipe."""
    from tests.recipe.test_config_from_source import RECIPES, _hf_model, hf_permute

    layouts = {"wide": (8, 4), "narrow": (4, 1)}
    models = {name: _hf_model(tmp_path / "models" / name, *hk) for name, hk in layouts.items()}
    recipe = str(RECIPES / "llama-hf-to-meta.yaml")
    assert _run(tmp_path, recipe, "--source", str(tmp_path / "models" / "wide"), "--target", "tasks.pt",
                "--executor", "ray", "--workers", "2") == 0, capsys.readouterr()
    assert _run(tmp_path, recipe, "--each", str(tmp_path / "models" / "*" / "model.safetensors"), "--target",
                str(tmp_path / "out" / "{parent}.pt"), "--executor", "ray") == 0, capsys.readouterr()
    for path, name in ((tmp_path / "tasks.pt", "wide"), *((tmp_path / "out" / f"{n}.pt", n) for n in layouts)):
        meta, hf, (heads, kv_heads) = torch.load(path, weights_only=True), models[name], layouts[name]
        for ours, theirs, n in (("wq", "q_proj", heads), ("wk", "k_proj", kv_heads)):
            assert torch.equal(hf_permute(meta[f"layers.1.attention.{ours}.weight"], n),
                               hf[f"model.layers.1.self_attn.{theirs}.weight"]), (path, ours)
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


@contextlib.contextmanager
def _held_port() -> Iterator[int]:
    """A port bound on every interface but not listening: a connection to it is refused, and no other
    program can listen on it while the test runs."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        yield s.getsockname()[1]


def test_an_address_where_nothing_answers_is_refused_at_once(tmp_path: Path) -> None:
    """A wrong --ray-address fails with a clear error instead of Ray retrying it for minutes (80 s and
    more here: the run is given 60)."""
    from safetensors.numpy import save_file

    save_file({"w": np.zeros((2, 2), np.float32)}, str(tmp_path / "ckpt.safetensors"))
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: ckpt.safetensors}\ntarget: {path: out.bpk}\n")
    with _held_port() as port:
        p = subprocess.run([sys.executable, "-m", "migrator.cli", "run", "r.yaml", "--no-progress", "--executor", "ray",
                            "--ray-address", f"127.0.0.1:{port}"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 1, p.stderr
    assert f"cannot join Ray at 127.0.0.1:{port}: nothing answers there (Connection refused)" in p.stderr
    assert "ray start --head" in p.stderr
    assert not (tmp_path / "out.bpk").exists()


def test_a_loopback_address_is_also_tried_at_the_node_address() -> None:
    """Ray reaches a loopback host through the node's own address, so an answer there is enough; an
    address answering nowhere is refused, and `auto`, `local` and other forms are left to Ray."""
    from migrator.core.errors import MigratorError
    from migrator.run.ray_executor import check_reachable

    with socket.socket() as listener, _held_port() as closed:
        listener.bind(("127.0.0.2", 0))  # the node address of this test: another loopback address
        listener.listen()
        port = listener.getsockname()[1]
        check_reachable(f"127.0.0.2:{port}", lambda: "127.0.0.9")  # answers at the address itself
        check_reachable(f"127.0.0.1:{port}", lambda: "127.0.0.2")  # answers only at the node address
        check_reachable(f"ray://127.0.0.1:{port}", lambda: "127.0.0.2")
        with pytest.raises(MigratorError, match=f"cannot join Ray at 127.0.0.1:{port}: nothing answers"):
            check_reachable(f"127.0.0.1:{port}", lambda: "127.0.0.3")
        with pytest.raises(MigratorError, match="nothing answers"):
            check_reachable(f"localhost:{closed}", lambda: "127.0.0.1")
    for address in ("auto", "local", "ray://head", "head:port"):
        check_reachable(address, lambda: pytest.fail("not an address to try"))  # type: ignore[arg-type,return-value]

"""A dequantizing recipe run many ways: `--jobs 2` (each job its own process), `--workers 2` (one output
written by several processes) and `--executor ray` (Ray tasks on a local Ray of 2 CPUs). Every output is
byte-equal to the single-process run's, and its weights equal compressed-tensors' dequantization of
the same folders (`FP8BlockDequantizer`, `FloatQuantizationCompressor.decompress`) bit for bit."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from migrator.cli import main
from tests.support.quantized import ct_float_dequantized, ct_float_folder, fp8_dequantized, fp8_folder

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("compressed_tensors")

REPO = Path(__file__).resolve().parents[3]


def oracle_fp8(stored: dict) -> dict:
    return fp8_dequantized(stored, torch.bfloat16)


def oracle_ct(stored: dict, qc: dict) -> dict:
    return ct_float_dequantized(stored, qc, torch.bfloat16)


@pytest.fixture
def recipes(tmp_path: Path) -> tuple[Path, dict[str, dict]]:
    """Two recipes dequantizing to BF16 into sharded folders: an FP8 block folder and a
    compressed-tensors block one; and each one's reference weights."""
    _, fp8 = fp8_folder(tmp_path / "fp8")
    _, ct, qc = ct_float_folder(tmp_path / "ct", "block", block=(32, 32))
    for name in ("fp8", "ct"):
        (tmp_path / f"{name}.yaml").write_text(
            f"version: 1\nsource: {{path: {name}}}\ndtype: {{cast: BF16}}\n"
            f"target: {{path: out-{name}/, shard: {{max_size: 20KB}}, format: safetensors}}\n")
    return tmp_path, {"fp8": oracle_fp8(fp8), "ct": oracle_ct(ct, qc)}


def _run(folder: Path, *args: str) -> int:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return main(["run", *args, "--no-progress"])
    finally:
        os.chdir(cwd)


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def _check(folder: Path, want: dict) -> None:
    got = {}
    for f in folder.glob("*.safetensors"):
        got.update(safetensors_torch.load_file(str(f)))
    assert len(list(folder.glob("*.safetensors"))) > 2  # sharded: write tasks and shards split the weights
    assert not [n for n in got if n.endswith(("_scale", "_scale_inv"))]
    for name, w in want.items():
        assert got[name].dtype == torch.bfloat16 and torch.equal(got[name].view(torch.int16), w.view(torch.int16)), name


def test_jobs_and_workers_give_the_single_process_bytes(recipes: tuple[Path, dict[str, dict]]) -> None:
    folder, want = recipes
    for name in want:
        assert _run(folder, f"{name}.yaml", "--target", f"serial-{name}/") == 0
        _check(folder / f"serial-{name}", want[name])
        assert _run(folder, f"{name}.yaml", "--target", f"workers-{name}/", "--workers", "2") == 0
        assert _files(folder / f"workers-{name}") == _files(folder / f"serial-{name}")
    assert _run(folder, "fp8.yaml", "ct.yaml", "--jobs", "2") == 0
    for name in want:
        assert _files(folder / f"out-{name}") == _files(folder / f"serial-{name}")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray = pytest.importorskip("ray")
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


def test_ray_tasks_give_the_single_process_bytes(local_ray: None, recipes: tuple[Path, dict[str, dict]]) -> None:
    folder, want = recipes
    for name in want:
        assert _run(folder, f"{name}.yaml", "--target", f"serial-{name}/") == 0
        assert _run(folder, f"{name}.yaml", "--target", f"ray-{name}/", "--executor", "ray", "--workers", "2") == 0
        assert _files(folder / f"ray-{name}") == _files(folder / f"serial-{name}")
        _check(folder / f"ray-{name}", want[name])
    assert _run(folder, "fp8.yaml", "ct.yaml", "--executor", "ray") == 0  # one Ray task per job
    for name in want:
        assert _files(folder / f"out-{name}") == _files(folder / f"serial-{name}")

"""`migrate run` of many jobs: several recipes, one recipe `--each` source, `--jobs N` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from migrator.run.jobs import target_for

REPO = Path(__file__).resolve().parents[2]


def migrate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "migrator.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"enc.weight": rng.standard_normal((30, 40)).astype(np.float32), "enc.bias": np.full(30, seed, np.float32)}


def _recipe(folder: Path, name: str, source: str, target: str) -> Path:
    path = folder / name
    path.write_text(f"version: 1\nsource: {{path: {source}}}\nremap: [{{from: '^enc\\.', to: 'encoder.'}}]\n"
                    f"target: {{path: {target}}}\n")
    return path


def _check_output(path: Path, seed: int) -> None:
    got = load_file(str(path))  # the safetensors library reads what the job wrote
    want = _weights(seed)
    assert sorted(got) == ["encoder.bias", "encoder.weight"]
    np.testing.assert_array_equal(got["encoder.weight"], want["enc.weight"])
    np.testing.assert_array_equal(got["encoder.bias"], want["enc.bias"])


@pytest.fixture
def three(tmp_path: Path) -> tuple[Path, list[Path]]:
    """Two good recipes, one whose source is missing (exit 1) and one invalid recipe (exit 2)."""
    for seed in (1, 2):
        save_file(_weights(seed), str(tmp_path / f"w{seed}.safetensors"))
    recipes = [_recipe(tmp_path, "a.yaml", "w1.safetensors", "out/a.safetensors"),
               _recipe(tmp_path, "missing.yaml", "nope.safetensors", "out/m.safetensors"),
               _recipe(tmp_path, "b.yaml", "w2.safetensors", "out/b.safetensors")]
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nsource: {path: w1.safetensors}\ntarget: {path: out/x.safetensors}\nremapp: []\n")
    return tmp_path, [recipes[0], recipes[1], bad, recipes[2]]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_failures_do_not_stop_the_other_jobs_and_the_exit_code_is_the_worst(three: tuple[Path, list[Path]],
                                                                          jobs: str) -> None:
    folder, recipes = three
    out = migrate("run", *map(str, recipes), "--jobs", jobs, "--report", "all.json", "--no-progress", cwd=folder)
    assert out.returncode == 2, out.stderr  # an invalid recipe is the worst
    _check_output(folder / "out/a.safetensors", 1)
    _check_output(folder / "out/b.safetensors", 2)
    assert not (folder / "out/m.safetensors").exists() and not (folder / "out/x.safetensors").exists()
    report = json.loads((folder / "all.json").read_text())
    assert report["status"] == "failed" and report["exit_code"] == 2
    assert [(j["recipe"], j["status"], j["exit_code"], j["written"]) for j in report["jobs"]] == [
        (str(recipes[0]), "ok", 0, True), (str(recipes[1]), "failed", 1, False),
        (str(recipes[2]), "invalid", 2, False), (str(recipes[3]), "ok", 0, True)]
    assert report["jobs"][0]["target"] == str(folder / "out/a.safetensors")
    assert "nope.safetensors" in json.dumps(report["jobs"][1]["errors"])
    assert "remapp" in report["jobs"][2]["errors"][0]["message"]
    # the text output: one block per job, whole, headed by its line, even when jobs ran in parallel
    blocks = out.stdout.split("\n[")
    assert len(blocks) == 4 and out.stdout.startswith("[")
    for block in blocks:
        head = block.splitlines()[0]
        if "a.yaml" in head:
            assert "wrote " + str(folder / "out/a.safetensors") in block and "b.safetensors" not in block
        if "b.yaml" in head:
            assert "wrote " + str(folder / "out/b.safetensors") in block and "a.safetensors" not in block
    assert out.stdout.rstrip().endswith("4 jobs: 2 ok, 2 failed")


def test_json_has_every_job(three: tuple[Path, list[Path]]) -> None:
    folder, recipes = three
    out = migrate("run", *map(str, recipes), "--jobs", "2", "--json", cwd=folder)
    doc = json.loads(out.stdout)
    assert out.returncode == 2 and doc["ok"] is False and doc["exit_code"] == 2
    assert [j["exit_code"] for j in doc["jobs"]] == [0, 1, 2, 0]
    assert doc["jobs"][0]["report"]["status"] == "ok" and doc["jobs"][2]["error"]["kind"] == "RecipeError"
    assert doc["jobs"][1]["error"]["message"]


def test_each_runs_one_recipe_over_many_sources_with_placeholders(tmp_path: Path) -> None:
    for seed, run in enumerate(("run-a", "run-b", "run-c")):
        (tmp_path / "runs" / run).mkdir(parents=True)
        save_file(_weights(seed), str(tmp_path / "runs" / run / "last.safetensors"))
    recipe = _recipe(tmp_path, "r.yaml", "unused.safetensors", "unused-out.safetensors")
    out = migrate("run", str(recipe), "--each", "runs/*/last.safetensors", "--target",
                  "out/{parent}/{stem}-{i:02d}.safetensors", "--report", "each.json", "--no-progress", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for i, run in enumerate(("run-a", "run-b", "run-c")):
        _check_output(tmp_path / "out" / run / f"last-{i:02d}.safetensors", i)
    report = json.loads((tmp_path / "each.json").read_text())
    assert [j["overrides"] for j in report["jobs"]] == [
        {"source": f"runs/{r}/last.safetensors", "target": f"out/{r}/last-{i:02d}.safetensors"}
        for i, r in enumerate(("run-a", "run-b", "run-c"))]
    # the same jobs one after the other give the same bytes
    serial = migrate("run", str(recipe), "--each", "runs/*/last.safetensors", "--target",
                     "serial/{parent}/{stem}-{i:02d}.safetensors", "--jobs", "1", "--no-progress", cwd=tmp_path)
    assert serial.returncode == 0, serial.stderr
    for i, run in enumerate(("run-a", "run-b", "run-c")):
        name = f"{run}/last-{i:02d}.safetensors"
        assert (tmp_path / "serial" / name).read_bytes() == (tmp_path / "out" / name).read_bytes()


def test_placeholders() -> None:
    assert target_for("o/{stem}.bpk", "runs/a/last.pt", 3) == "o/last.bpk"
    assert target_for("o/{parent}_{name}_{i:03d}", "runs/a/last.pt", 3) == "o/a_last.pt_003"
    assert target_for("o/{{x}}{stem}/", "hf/model/", 0) == "o/{x}model/"


@pytest.mark.parametrize(("args", "message"), [
    (["--each", "runs/*/last.safetensors", "--target", "out/{stem}.safetensors"], "two jobs write"),
    (["--each", "runs/*/last.safetensors", "--target", "out/{nope}.safetensors"], "unknown placeholder {nope}"),
    (["--each", "nothing/*.pt", "--target", "out/{stem}.bpk"], "matches no file"),
    (["--each", "runs/*/last.safetensors"], "--each needs --target"),
    (["--each", "runs/*/last.safetensors", "--source", "x", "--target", "o/{i}"], "--source cannot"),
    (["--each", "runs/*/last.safetensors", "--target", "runs/a/last.safetensors"], "two jobs write"),
])
def test_bad_each_is_a_usage_error_before_anything_runs(tmp_path: Path, args: list[str], message: str) -> None:
    for run in ("a", "b"):
        (tmp_path / "runs" / run).mkdir(parents=True)
        save_file(_weights(0), str(tmp_path / "runs" / run / "last.safetensors"))
    recipe = _recipe(tmp_path, "r.yaml", "x.safetensors", "x-out.safetensors")
    out = migrate("run", str(recipe), *args, "--no-progress", cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()


def test_a_job_writing_what_another_reads_is_refused(tmp_path: Path) -> None:
    save_file(_weights(0), str(tmp_path / "w.safetensors"))
    first = _recipe(tmp_path, "first.yaml", "w.safetensors", "mid.safetensors")
    second = _recipe(tmp_path, "second.yaml", "mid.safetensors", "end.safetensors")
    out = migrate("run", str(first), str(second), cwd=tmp_path)
    assert out.returncode == 2 and "which second.yaml" in out.stderr.replace(str(tmp_path) + "/", "")
    assert not (tmp_path / "mid.safetensors").exists()
    same = migrate("run", str(first), str(first), cwd=tmp_path)
    assert same.returncode == 2 and "two jobs write" in same.stderr


def test_ray_is_imported_only_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    code = ("import sys, migrator.cli, migrator.run.jobs, migrator.run.parallel_write, migrator.run.ray_executor\n"
            "assert 'ray' not in sys.modules, 'ray imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    from migrator.core.errors import MigratorError
    from migrator.run.ray_executor import ray_module

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(MigratorError, match=r"pip install 'migrator\[ray\]'"):
        ray_module()


def test_the_default_jobs_are_the_cpus_this_process_may_use() -> None:
    from migrator.run.jobs import available_cpus

    want = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert available_cpus() == want


def test_jobs_executor_comes_from_the_flag_else_the_recipes_which_must_agree(tmp_path: Path) -> None:
    import argparse

    from migrator.run.jobs import JobsUsageError, jobs_executor

    base = "version: 1\nsource: {path: w.safetensors}\ntarget: {path: %s}\n"
    (tmp_path / "ray.yaml").write_text(base % "a.bpk" + "executor: {ray: {address: 'head:6379'}}\n")
    (tmp_path / "ray2.yaml").write_text(base % "b.bpk" + "executor: {ray: {address: 'head:6379'}}\n")
    (tmp_path / "here.yaml").write_text(base % "c.bpk")

    def specs(*names: str) -> list[dict[str, str]]:
        return [{"recipe": str(tmp_path / n), "label": n} for n in names]

    flags = argparse.Namespace(executor=None, ray_address=None)
    assert jobs_executor(flags, specs("ray.yaml", "ray2.yaml")) == ("ray", "head:6379")
    assert jobs_executor(flags, specs("here.yaml")) == ("local", None)
    with pytest.raises(JobsUsageError, match=r"ray.yaml: ray at head:6379, here.yaml: local\): give --executor"):
        jobs_executor(flags, specs("ray.yaml", "here.yaml"))
    assert jobs_executor(argparse.Namespace(executor="local", ray_address=None),
                         specs("ray.yaml", "here.yaml")) == ("local", None)
    assert jobs_executor(argparse.Namespace(executor=None, ray_address="other:1"),
                         specs("ray.yaml", "ray2.yaml")) == ("ray", "other:1")

"""The engine (`migrator.run.recipe.run_recipe`): one function runs a recipe, returns the run as a
value and prints nothing; every command and the API go through it; storage options travel with the
plan, not through a process-wide registry."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy as st_numpy

from migrator.run import recipe as engine
from migrator.run.recipe import RunOptions, run_recipe
from tests.support.cli import migrate_in_process


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    rng = np.random.default_rng(0)
    st_numpy.save_file({"a.weight": rng.standard_normal((3, 2)).astype(np.float32),
                        "b.weight": rng.standard_normal((4,)).astype(np.float32)}, str(tmp_path / "m.safetensors"))
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: m.safetensors}\nremap: [{from: '^a\\.', to: 'x.'}]\n"
                                     "target: {path: out.safetensors}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_run_prints_nothing_and_says_what_it_wrote(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outcome = run_recipe(ws / "r.yaml", RunOptions(report=str(ws / "rep.json")))
    assert capsys.readouterr() == ("", "")
    want = st_numpy.load_file(str(ws / "m.safetensors"))
    got = st_numpy.load_file(str(ws / "out.safetensors"))  # safetensors reads what the outcome says it wrote
    assert sorted(got) == ["b.weight", "x.weight"] and np.array_equal(got["x.weight"], want["a.weight"])
    assert outcome.code == 0 and outcome.error is None and outcome.failure is None
    assert outcome.written is not None and outcome.written.target == str(ws / "out.safetensors")
    assert outcome.written.tensors == 2 and outcome.written.nbytes == (6 + 4) * 4
    assert outcome.concluded is not None and outcome.concluded.status == "ok" and outcome.concluded.written
    assert outcome.report == json.loads((ws / "rep.json").read_text())  # the --report file is the value's


@pytest.mark.parametrize("case", ["invalid", "missing_source", "target_exists", "missing_tensor"])
def test_a_failed_run_prints_nothing_and_says_why(ws: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    recipe = ws / "r.yaml"
    if case == "invalid":
        recipe.write_text("version: 1\nsource: {path: m.safetensors}\n")  # no target
    elif case == "missing_source":
        (ws / "m.safetensors").unlink()
    elif case == "target_exists":
        (ws / "out.safetensors").write_bytes(b"old")
    else:  # a template slot no source tensor fills: a plan with a fatal problem
        st_numpy.save_file({"zzz": np.zeros(2, np.float32)}, str(ws / "t.safetensors"))
        recipe.write_text("version: 1\nsource: {path: m.safetensors}\n"
                          "target: {path: out.bpk, template: t.safetensors}\n")
    outcome = run_recipe(recipe, RunOptions())
    assert capsys.readouterr() == ("", "")
    assert outcome.written is None and outcome.code == (2 if case == "invalid" else 1)
    assert outcome.invalid == (case == "invalid")
    assert (outcome.error is None) == (case == "missing_tensor")  # a planned run that refuses says so in its report
    assert outcome.report["status"] == ("invalid" if case == "invalid" else "failed")
    assert outcome.report["written"] is False and outcome.report["errors"]
    if case == "target_exists":
        assert (ws / "out.safetensors").read_bytes() == b"old"


def test_the_outcome_crosses_processes_whole(ws: Path) -> None:
    """A job's outcome is pickled back from its worker: its error keeps its type and fields."""
    (ws / "r.yaml").write_text("version: 1\nsource: {path: m.safetensors}\n")
    outcome = run_recipe(ws / "r.yaml")
    back = pickle.loads(pickle.dumps(outcome))
    assert type(back.error) is type(outcome.error) and str(back.error) == str(outcome.error)
    assert back.error.issues == outcome.error.issues and back.document == outcome.document  # type: ignore[union-attr]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, RunOptions, bool]]:
    calls: list[tuple[Any, RunOptions, bool]] = []

    def spy(recipe: Any, options: RunOptions | None = None, **kw: Any) -> Any:
        options = options or RunOptions()
        calls.append((recipe, options, "use" in kw))
        return run_recipe(recipe, options, **kw)

    monkeypatch.setattr(engine, "run_recipe", spy)
    return calls


def test_migrate_run_and_each_job_go_through_the_engine(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    assert migrate_in_process("run", "r.yaml", "--no-progress").returncode == 0
    assert [(c[0], c[2]) for c in calls] == [("r.yaml", False)]
    calls.clear()
    p = migrate_in_process("run", "r.yaml", "--each", "m.safetensors", "--target", "o/{stem}.safetensors",
                           "--jobs", "1", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert len(calls) == 1 and calls[0][1].one_of_many and calls[0][1].source == str(ws / "m.safetensors")


def test_the_api_goes_through_the_engine(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import migrator

    calls = _spy(monkeypatch)
    report = migrator.run_recipe(ws / "r.yaml", fsync=False)
    assert report.status == "ok" and len(calls) == 1 and calls[0][1].fsync is False


def test_diff_recipe_goes_through_the_engine_and_writes_nothing(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert migrate_in_process("run", "r.yaml", "--no-progress").returncode == 0
    (ws / "out.safetensors").rename(ws / "b.safetensors")
    calls = _spy(monkeypatch)
    p = migrate_in_process("diff", "m.safetensors", "b.safetensors", "--recipe", "r.yaml", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["matched"], p.stdout + p.stderr
    assert len(calls) == 1 and calls[0][2] and calls[0][1].compared and calls[0][1].source == "m.safetensors"
    assert not (ws / "out.safetensors").exists()


def test_storage_options_reach_the_opener_as_a_value(ws: Path) -> None:
    """A recipe's storage_options are handed to fsspec for its URLs (fsspec's own `storage_options`
    say what it was built with), and nothing of them outlives the run: the same URL opened afterwards
    gets the protocol's defaults."""
    fsspec = pytest.importorskip("fsspec")
    from migrator.files.io import open_file
    from migrator.plan.loaded import load, open_plan
    from migrator.storage.remote import options

    fsspec.filesystem("memory").pipe_file("/engine-test/m.safetensors", (ws / "m.safetensors").read_bytes())
    url = "memory://engine-test/m.safetensors"
    (ws / "r.yaml").write_text(f"version: 1\nsource: {{path: '{url}', "
                               "storage_options: {use_listings_cache: false}}\ntarget: {path: out.safetensors}\n")
    with open_plan(load(ws / "r.yaml")) as plan:
        assert plan.storage.for_url(url) == {"use_listings_cache": False}
        assert plan.readers[0].source.fs.storage_options == {"use_listings_cache": False}  # type: ignore[attr-defined]
    assert not hasattr(options, "register_options") and not hasattr(options, "options_for")
    with open_file(url) as reader:  # no recipe: the protocol's defaults
        assert reader.source.fs.storage_options == {}  # type: ignore[attr-defined]
    assert run_recipe(ws / "r.yaml").code == 0
    assert sorted(st_numpy.load_file(str(ws / "out.safetensors"))) == ["a.weight", "b.weight"]
    fsspec.filesystem("memory").rm("/engine-test", recursive=True)

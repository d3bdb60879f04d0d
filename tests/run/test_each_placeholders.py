"""`--each` placeholders never make a path part that leaves the target: no `..`, `.`, empty part.

fsspec's globs match dot names (`in/..`, `in/...`), a key may hold `..` parts, and a format spec can
shorten a value (`{stem:.0}`). A target part filled by a placeholder must be a plain name: a match
that would make it `..`, `.` or empty is refused by name before any job runs, for local paths and
URLs alike. Oracles: the files the test made, untouched; the paths `target_for` gives for good names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save, save_file

from migrator.run.jobs import JobsUsageError, target_for
from tests.support.cli import migrate_in_process

BAD = [
    ("out/{stem}/model.safetensors", "in/...x"),  # a local file named '...x': its stem is '..'
    ("out/{stem}/model.safetensors", "in/..bpk"),  # stem '.'
    ("out/{stem}/model.safetensors", "memory://in/.."),
    ("out/{name}/model.safetensors", "s3://bucket/in/.."),
    ("out/{parent}/{stem}.safetensors", "s3://bucket/a/../m.pt"),
    ("out/{stem}/m.safetensors", "gs://bucket/in/...pt"),
    ("out/{parent}/{stem}.safetensors", "/m.pt"),  # the root has no name: an empty part
    ("out/{stem:.0}/m.safetensors", "in/m.pt"),  # a spec that empties a value
    ("out/{stem:.2}/m.safetensors", "in/..x.pt"),  # ...or cuts it to '..'
    ("{parent}/{stem}.safetensors", "/m.pt"),  # an empty first part would make the target absolute
    ("out/{stem}{stem}/m.safetensors", "az://c/in/..pt"),  # two values joined into '..'
    ("out/{stem}/{i}.safetensors", "az://c/in/..pt"),
]


@pytest.mark.parametrize(("pattern", "source"), BAD)
def test_a_placeholder_never_makes_a_dot_or_empty_part(pattern: str, source: str) -> None:
    with pytest.raises(JobsUsageError, match="--each") as e:
        target_for(pattern, source, 0)
    assert source.rsplit("/", 1)[-1] in str(e.value) or source in str(e.value)


@pytest.mark.parametrize(("pattern", "source", "want"), [
    ("../out/{stem}.bpk", "in/a.pt", "../out/a.bpk"),  # a '..' the user typed is theirs
    ("out/{stem}/./{i:03d}.bpk", "in/a.pt", "out/a/./000.bpk"),
    ("out/{parent}/{name}", "s3://bucket/runs/x/last.pt", "out/x/last.pt"),
    ("out/{stem}.bpk", "in/...pt", "out/...bpk"),  # '...' is a name like any other
    ("s3://b/out/{stem}.bpk", "in/.hidden.pt", "s3://b/out/.hidden.bpk"),
])
def test_good_names_still_fill_in(pattern: str, source: str, want: str) -> None:
    assert target_for(pattern, source, 0) == want


def _recipe(tmp_path: Path) -> Path:
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: x.safetensors}\ntarget: {path: y.safetensors}\n")
    return tmp_path / "r.yaml"


@pytest.mark.parametrize(("key", "each", "target"), [
    ("/each1/in/..", "memory://each1/in/*", "out/{stem}/model.safetensors"),
    ("/each2/in/..", "memory://each2/in/*", "out/{name}/model.safetensors"),
    ("/each3/in/a/../model.safetensors", "memory://each3/in/a/../model.safetensors", "out/{parent}/{name}"),
])
def test_each_over_a_store_never_writes_outside_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             key: str, each: str, target: str) -> None:
    """With --overwrite, the match used to replace `tmp/model.safetensors`, outside `out/`."""
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe(key, save({"w": np.ones(4, np.float32)}))
    save_file({"precious": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
    before = (tmp_path / "model.safetensors").read_bytes()
    monkeypatch.chdir(tmp_path)
    try:
        p = migrate_in_process("run", str(_recipe(tmp_path)), "--each", each, "--target", target, "--overwrite",
                               "--jobs", "1", "--no-progress")
    finally:
        fs.rm(key.rsplit("/in/", 1)[0], recursive=True)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--each" in p.stderr and "'..'" in p.stderr
    assert (tmp_path / "model.safetensors").read_bytes() == before
    assert not (tmp_path / "out").exists()


def test_each_over_local_dot_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "in").mkdir()
    save_file({"w": np.ones(4, np.float32)}, str(tmp_path / "in" / "...x"))
    save_file({"w": np.ones(4, np.float32)}, str(tmp_path / "in" / "ok"))
    save_file({"precious": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
    before = (tmp_path / "model.safetensors").read_bytes()
    monkeypatch.chdir(tmp_path)
    p = migrate_in_process("run", str(_recipe(tmp_path)), "--each", "in/.*", "in/ok", "--target",
                           "out/{stem}/model.safetensors", "--overwrite", "--jobs", "1", "--no-progress")
    assert p.returncode == 2 and "in/...x" in p.stderr, p.stdout + p.stderr
    assert (tmp_path / "model.safetensors").read_bytes() == before and not (tmp_path / "out").exists()

"""`--overwrite` of a folder target replaces a model, never the user's other files.

A local folder is published whole (one rename), so an existing folder may be replaced only when it
holds nothing but what a model folder is made of: its weights (index, single weights file, numbered
shards, the shards its index names), the files this run writes and the companions asked for. A folder
with anything else in it is refused, naming those files, and left as it was. The current folder (or
one holding it) is never swapped away. Oracles: the files' bytes before and after, the `safetensors`
library's reading of what was written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.support.cli import migrate_in_process

migrate = migrate_in_process


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"layer.{i}.weight": rng.standard_normal((16, 16)).astype(np.float32) for i in range(4)}


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every entry under `folder` (relative path -> bytes, None for a folder)."""
    out: dict[str, bytes | None] = {}
    for p in sorted(folder.rglob("*")):
        out[str(p.relative_to(folder))] = None if p.is_dir() else p.read_bytes()
    return out


def read_folder(folder: Path) -> dict[str, np.ndarray]:
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return load_file(str(folder / "model.safetensors"))
    got: dict[str, np.ndarray] = {}
    for shard in set(json.loads(index.read_text())["weight_map"].values()):
        got |= load_file(str(folder / shard))
    return got


@pytest.fixture
def src(tmp_path: Path) -> Path:
    save_file(weights(1), str(tmp_path / "src.safetensors"))
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    return tmp_path / "src.safetensors"


def old_model(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights(0), str(folder / "model.safetensors"))


FOREIGN = {
    "notes": {"notes.txt": b"my notes"},
    "data folder": {"data/train.csv": b"a,b\n1,2\n"},
    "optimizer state": {"optimizer.pt": b"not a model part"},
    "other weights": {"lora.safetensors": b"mine"},
    "hidden": {".git/HEAD": b"ref: refs/heads/main\n"},
    "an old companion": {"tokenizer.json": b"{}"},
}


def _add(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


@pytest.mark.parametrize("kind", sorted(FOREIGN))
@pytest.mark.parametrize("how", ["convert", "convert-sharded", "run", "run-workers"])
def test_a_folder_with_foreign_files_is_refused_and_kept(tmp_path: Path, src: Path, kind: str, how: str) -> None:
    out = tmp_path / "out"
    old_model(out)
    _add(out, FOREIGN[kind])
    before = tree(out)
    if how.startswith("run"):  # with --workers, the shards are written by a pool (parallel_write)
        (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: src.safetensors}\n"
                                         "target: {path: out/, copy: [config.json], overwrite: true, "
                                         "shard: {max_size: 2000}}\n")
        p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress", *(["--workers", "2"] if "workers" in how else []))
    else:
        extra = ["--max-shard-size", "2000"] if how == "convert-sharded" else []
        p = migrate("convert", str(src), f"{out}/", "--copy", "config.json", "--overwrite", *extra)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "not part of a model folder" in p.stderr
    for rel in FOREIGN[kind]:
        assert rel.split("/")[0] in p.stderr
    assert tree(out) == before  # nothing deleted, nothing replaced
    assert sorted(n for n in os.listdir(tmp_path) if "migrator-" in n) == []


def test_python_save_refuses_a_folder_with_foreign_files(tmp_path: Path) -> None:
    from migrator import save
    from migrator.core.errors import OutputError
    from migrator.core.tensor import from_numpy

    old_model(tmp_path / "m")
    (tmp_path / "m" / "README.md").write_text("mine")
    before = tree(tmp_path / "m")
    with pytest.raises(OutputError, match=r"README\.md"):
        save([from_numpy(k, v) for k, v in weights(2).items()], tmp_path / "m", max_shard_size=2000, overwrite=True)
    assert tree(tmp_path / "m") == before


def test_a_model_folder_is_replaced_whole(tmp_path: Path, src: Path) -> None:
    """Old shards, their index, a single weights file and a companion asked for again are replaced;
    old shards the new model does not have are gone (never a mix)."""
    out = tmp_path / "out"
    save_file(weights(5), str(tmp_path / "old.safetensors"))
    assert migrate("convert", str(tmp_path / "old.safetensors"), f"{out}/", "--max-shard-size", "1100",
                   "--copy", "config.json").returncode == 0
    assert len(list(out.glob("model-*-of-00004.safetensors"))) == 4
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    p = migrate("convert", str(src), f"{out}/", "--max-shard-size", "2200", "--copy", "config.json", "--overwrite")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(out)) == ["config.json", "model-00001-of-00002.safetensors",
                                       "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    assert (out / "config.json").read_text() == '{"model_type": "gpt2"}'
    got, want = read_folder(out), weights(1)
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)


def test_shards_an_old_index_names_are_model_parts(tmp_path: Path, src: Path) -> None:
    """A folder written by another tool: its index names shards with names of its own."""
    out = tmp_path / "out"
    out.mkdir()
    w = weights(0)
    save_file(dict(list(w.items())[:2]), str(out / "part-a.safetensors"))
    save_file(dict(list(w.items())[2:]), str(out / "part-b.safetensors"))
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "part-a.safetensors" if i < 2 else "part-b.safetensors"
                                        for i, k in enumerate(w)}}))
    p = migrate("convert", str(src), f"{out}/", "--max-shard-size", "2200", "--overwrite")
    assert p.returncode == 0, p.stderr
    assert "part-a.safetensors" not in os.listdir(out)


@pytest.mark.parametrize("spelling", [".", "./", "CWD", "PARENT"])
def test_the_current_folder_is_never_replaced(tmp_path: Path, src: Path, spelling: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Not even when it holds only a model: swapping it away would leave the shell in a deleted folder."""
    here = tmp_path / "work" / "here"
    old_model(here)
    monkeypatch.chdir(here)
    target = {".": ".", "./": "./", "CWD": str(here) + "/", "PARENT": str(tmp_path / "work") + "/"}[spelling]
    before = tree(tmp_path / "work")
    p = migrate("convert", str(src), target, "--max-shard-size", "2000", "--overwrite")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "current folder" in p.stderr
    assert tree(tmp_path / "work") == before
    assert os.path.samefile(os.getcwd(), here)


def test_the_current_folder_with_notes_is_kept(tmp_path: Path, src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = tmp_path / "here"
    old_model(here)
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    before = tree(here)
    p = migrate("convert", str(src), "./", "--copy", "config.json", "--overwrite")
    assert p.returncode == 1 and tree(here) == before


def test_a_file_added_while_writing_stops_the_publish(tmp_path: Path) -> None:
    """Checked again right before the publish: a file that appeared meanwhile is never deleted."""
    from migrator.core.errors import OutputError
    from migrator.storage.atomic_folder import atomic_folder

    old_model(tmp_path / "m")
    before = (tmp_path / "m" / "model.safetensors").read_bytes()
    with pytest.raises(OutputError, match=r"notes\.txt"), \
            atomic_folder(tmp_path / "m", overwrite=True, names=["model.safetensors"]) as folder:
        with folder.file("model.safetensors") as sink:
            sink.write(b"new")
        (tmp_path / "m" / "notes.txt").write_text("added meanwhile")
    assert (tmp_path / "m" / "notes.txt").read_text() == "added meanwhile"
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["m"]  # no scratch folder left

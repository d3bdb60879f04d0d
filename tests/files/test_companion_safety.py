"""Companion files (`--copy`, `target.copy`): copied only from inside the source's folder, never weights.

A companion must resolve inside the folder it is copied from, as an index's shards must: a link
(to a file or a folder) leading out of it is refused by name. The one exception is a Hugging Face
cache snapshot (`.../models--org--name/snapshots/REV/`), whose files are links to `../../blobs/`:
there a link into that repository's `blobs/` folder is inside. Weight files and indexes are never
companions: a glob skips them, a name is refused. Oracles: the bytes of the files the test made and
the `safetensors` library's reading of the output.
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


def same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def read_folder(folder: Path) -> dict[str, np.ndarray]:
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return load_file(str(folder / "model.safetensors"))
    got: dict[str, np.ndarray] = {}
    for shard in set(json.loads(index.read_text())["weight_map"].values()):
        got |= load_file(str(folder / shard))
    return got


@pytest.fixture
def hf(tmp_path: Path) -> Path:
    """A model folder (one weights file, config.json) and a secret file beside it, outside."""
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file(weights(), str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "id_rsa.json").write_text("PRIVATE KEY")
    return folder


LINKS = {
    "file by name": ({"tokenizer.json": "../secret/id_rsa.json"}, ["--copy", "tokenizer.json"]),
    "file by glob": ({"tokenizer.json": "../secret/id_rsa.json"}, ["--copy", "*.json"]),
    "absolute link": ({"vocab.json": "ABS"}, ["--copy", "vocab.json"]),
    "linked folder": ({"extra": "../secret"}, ["--copy", "extra/*"]),
    "linked folder by name": ({"extra": "../secret"}, ["--copy", "extra/id_rsa.json"]),
    "two hops": ({"a.json": "b.json", "b.json": "../secret/id_rsa.json"}, ["--copy", "a.json"]),
}


@pytest.mark.parametrize("case", sorted(LINKS))
@pytest.mark.parametrize("how", ["convert", "run"])
def test_a_companion_linking_out_of_the_folder_is_refused(tmp_path: Path, hf: Path, case: str, how: str) -> None:
    links, args = LINKS[case]
    for name, to in links.items():
        os.symlink(str(tmp_path / "secret" / "id_rsa.json") if to == "ABS" else to, hf / name)
    if how == "convert":
        p = migrate("convert", str(hf), str(tmp_path / "out") + "/", *args)
    else:
        copies = ", ".join(repr(a) for a in args[1::2])
        (tmp_path / "r.yaml").write_text(f"version: 1\nsource: {{path: hf}}\n"
                                         f"target: {{path: out/, copy: [{copies}]}}\n")
        p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "leaves the source folder" in p.stderr
    assert not (tmp_path / "out").exists()


def test_a_link_inside_the_folder_is_a_companion(tmp_path: Path, hf: Path) -> None:
    (hf / "real").mkdir()
    (hf / "real" / "tokenizer.json").write_text('{"v": 1}')
    os.symlink("real/tokenizer.json", hf / "tokenizer.json")
    os.symlink("real", hf / "tok")
    p = migrate("convert", str(hf), str(tmp_path / "out") + "/", "--copy", "tokenizer.json", "--copy", "tok/*")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "tokenizer.json").read_text() == '{"v": 1}'
    assert (tmp_path / "out" / "tok" / "tokenizer.json").read_text() == '{"v": 1}'


def _snapshot(hub: Path, files: dict[str, bytes], sharded: bool = False) -> Path:
    """A Hugging Face cache entry as huggingface_hub lays it out: blobs named by hash, and a snapshot
    folder of relative links to them."""
    import hashlib

    repo = hub / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(repo / "blobs" / digest, (snap / name).parent), snap / name)
    return snap


@pytest.mark.parametrize("sharded", [False, True])
def test_a_hugging_face_cache_snapshot_reads_as_a_model_folder(tmp_path: Path, sharded: bool) -> None:
    from safetensors.numpy import save

    w = weights(3)
    files = {"config.json": b'{"model_type": "bert"}', "tokenizer/vocab.txt": b"[PAD]\n[UNK]\n"}
    if sharded:
        names = list(w)
        files["model-00001-of-00002.safetensors"] = save({k: w[k] for k in names[:2]})
        files["model-00002-of-00002.safetensors"] = save({k: w[k] for k in names[2:]})
        files["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": {
            k: f"model-0000{1 + (i >= 2)}-of-00002.safetensors" for i, k in enumerate(names)}}).encode()
    else:
        files["model.safetensors"] = save(w)
    snap = _snapshot(tmp_path / "hub", files)
    p = migrate("convert", str(snap), str(tmp_path / "out") + "/", "--copy", "config.json", "--copy", "tokenizer/*")
    assert p.returncode == 0, p.stderr
    same(read_folder(tmp_path / "out"), w)
    assert (tmp_path / "out" / "config.json").read_bytes() == files["config.json"]
    assert (tmp_path / "out" / "tokenizer" / "vocab.txt").read_bytes() == files["tokenizer/vocab.txt"]


@pytest.mark.parametrize("where", ["outside the cache", "another repository's blobs", "the repository's refs"])
def test_a_snapshot_link_out_of_its_blobs_is_refused(tmp_path: Path, where: str) -> None:
    snap = _snapshot(tmp_path / "hub", {"model.safetensors": b"", "config.json": b"{}"})
    os.unlink(snap / "model.safetensors")
    save_file(weights(), str(snap / "model.safetensors"))
    other = {"outside the cache": tmp_path / "secret.json", "the repository's refs": snap.parents[1] / "refs" / "main",
             "another repository's blobs": tmp_path / "hub" / "models--evil--x" / "blobs" / "feed"}[where]
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text("PRIVATE")
    os.symlink(os.path.relpath(other, snap), snap / "tokenizer.json")
    p = migrate("convert", str(snap), str(tmp_path / "out") + "/", "--copy", "tokenizer.json")
    assert p.returncode == 1 and "leaves the source folder" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_a_snapshot_shard_link_out_of_its_blobs_is_refused(tmp_path: Path) -> None:
    from safetensors.numpy import save

    w = weights(4)
    snap = _snapshot(tmp_path / "hub", {"model.safetensors.index.json": json.dumps(
        {"metadata": {}, "weight_map": dict.fromkeys(w, "model-00001-of-00001.safetensors")}).encode()})
    (tmp_path / "elsewhere.safetensors").write_bytes(save(w))
    os.symlink(os.path.relpath(tmp_path / "elsewhere.safetensors", snap), snap / "model-00001-of-00001.safetensors")
    p = migrate("inspect", str(snap))
    assert p.returncode == 1 and "leaves the index's folder" in p.stderr, p.stderr


# ---------------------------------------------------------------- weights are never companions

@pytest.fixture
def sharded_src(tmp_path: Path) -> Path:
    save_file(weights(7), str(tmp_path / "one.safetensors"))
    assert migrate("convert", str(tmp_path / "one.safetensors"), str(tmp_path / "hf") + "/", "--max-shard-size",
                   "1100").returncode == 0
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "hf" / "tokenizer.json").write_text("{}")
    return tmp_path / "hf"


@pytest.mark.parametrize("size", ["5GB", "2200"])
@pytest.mark.parametrize("pattern", ["*", "*.*", "*.json", "*o*"])
def test_a_glob_never_copies_weights_or_indexes(tmp_path: Path, sharded_src: Path, pattern: str, size: str) -> None:
    p = migrate("convert", str(sharded_src), str(tmp_path / "out") + "/", "--max-shard-size", size,
                "--copy", pattern)
    assert p.returncode == 0, p.stderr
    names = sorted(os.listdir(tmp_path / "out"))
    weight_names = ["model.safetensors"] if size == "5GB" else [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    companions = {"*": ["config.json", "tokenizer.json"], "*.*": ["config.json", "tokenizer.json"],
                  "*.json": ["config.json", "tokenizer.json"], "*o*": ["config.json", "tokenizer.json"]}[pattern]
    assert names == sorted(weight_names + companions)
    same(read_folder(tmp_path / "out"), weights(7))
    with __import__("migrator").open_file(tmp_path / "out") as r:  # the folder reads as one model
        assert sorted(r.names()) == sorted(weights(7))


@pytest.mark.parametrize("name", ["model.safetensors.index.json", "model-00001-of-00004.safetensors",
                                  "model-0000[12]-of-00004.safetensors", "*.safetensors", "model*"])
def test_naming_weights_as_companions_is_refused(tmp_path: Path, sharded_src: Path, name: str) -> None:
    p = migrate("convert", str(sharded_src), str(tmp_path / "out") + "/", "--copy", name)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "weight" in p.stderr and "companion" in p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("weights_name", ["pytorch_model.bin", "model.pt", "consolidated.00.pth", "old.bpk"])
def test_other_weight_files_are_skipped_by_a_glob(tmp_path: Path, hf: Path, weights_name: str) -> None:
    (hf / weights_name).write_bytes(b"weights")
    p = migrate("convert", str(hf / "model.safetensors"), str(tmp_path / "out") + "/", "--max-shard-size", "2200",
                "--copy", "*")
    assert p.returncode == 0, p.stderr
    assert weights_name not in os.listdir(tmp_path / "out")
    assert "config.json" in os.listdir(tmp_path / "out")
    same(read_folder(tmp_path / "out"), weights())

"""Sharded sources: a model folder, an index or a glob read as one checkpoint, against torch's tensors."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
hf_serialization = pytest.importorskip("huggingface_hub.serialization")

from migrator.core.errors import FormatError, ReaderClosedError  # noqa: E402
from migrator.files.io import open_file, save  # noqa: E402
from migrator.files.sharded import OPEN_SHARDS  # noqa: E402
from tests.support.models import tiny_bert  # noqa: E402

REPO = Path(__file__).resolve().parents[2]




@pytest.fixture(scope="module")
def bert() -> object:
    return tiny_bert()


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory: pytest.TempPathFactory, bert: object) -> Path:
    out = tmp_path_factory.mktemp("st") / "bert"
    bert.save_pretrained(out, max_shard_size="20KB")  # type: ignore[attr-defined]
    assert len(list(out.glob("model-*.safetensors"))) > 2
    return out


@pytest.fixture(scope="module")
def bin_folder(tmp_path_factory: pytest.TempPathFactory, bert: object) -> Path:
    # transformers 5 saves SafeTensors only; huggingface_hub writes transformers' .bin layout
    out = tmp_path_factory.mktemp("bin") / "bert"
    out.mkdir()
    hf_serialization.save_torch_state_dict(bert.state_dict(), out, safe_serialization=False,  # type: ignore[attr-defined]
                                           max_shard_size="20KB")
    assert (out / "pytorch_model.bin.index.json").is_file()
    return out


def _as_torch(t: object) -> object:
    import numpy as np

    arr = np.array(t.numpy())  # type: ignore[attr-defined]
    return torch.from_numpy(arr)


def _check_equal(reader: object, state: dict[str, object]) -> None:
    assert sorted(reader.names()) == sorted(state)  # type: ignore[attr-defined]
    for t in reader.tensors:  # type: ignore[attr-defined]
        assert torch.equal(_as_torch(t), state[t.name]), t.name


@pytest.mark.parametrize("how", ["folder", "index", "glob"])
def test_safetensors_shards_equal_torch(st_folder: Path, bert: object, how: str) -> None:
    src = {"folder": st_folder, "index": st_folder / "model.safetensors.index.json",
           "glob": st_folder / "model-*.safetensors"}[how]
    with open_file(src) as r:
        assert r.format == "safetensors"
        _check_equal(r, bert.state_dict())  # type: ignore[attr-defined]
        assert r.metadata.get("format") == "pt"  # every shard's own metadata agrees
        assert "total_size" not in r.metadata  # describes the index's files, not the model


@pytest.mark.parametrize("how", ["folder", "index", "glob"])
def test_bin_shards_equal_torch(bin_folder: Path, bert: object, how: str) -> None:
    src = {"folder": bin_folder, "index": bin_folder / "pytorch_model.bin.index.json",
           "glob": bin_folder / "pytorch_model-*.bin"}[how]
    with open_file(src) as r:
        assert r.format == "pytorch"
        _check_equal(r, bert.state_dict())  # type: ignore[attr-defined]


def test_folder_prefers_safetensors_over_bin(tmp_path: Path, st_folder: Path, bin_folder: Path) -> None:
    both = tmp_path / "both"
    both.mkdir()
    for f in [*st_folder.iterdir(), *bin_folder.iterdir()]:
        os.link(f, both / f.name)
    with open_file(both) as r:
        assert r.format == "safetensors"


def test_single_weights_file_folder(tmp_path: Path, bert: object) -> None:
    bert.save_pretrained(tmp_path)  # type: ignore[attr-defined]
    assert (tmp_path / "model.safetensors").is_file()
    with open_file(tmp_path) as r:
        _check_equal(r, bert.state_dict())  # type: ignore[attr-defined]


def _copy(folder: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in folder.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _index(folder: Path) -> dict[str, object]:
    return json.loads((folder / "model.safetensors.index.json").read_text())  # type: ignore[no-any-return]


def _write_index(folder: Path, data: object) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps(data))


def test_two_candidates_of_one_kind(tmp_path: Path, st_folder: Path) -> None:
    f = _copy(st_folder, tmp_path / "m")
    (f / "adapter_model.safetensors").write_bytes((f / "model-00001-of-00005.safetensors").read_bytes())
    with pytest.raises(FormatError, match=r"several weights of one kind: adapter_model.safetensors, "
                                          r"model.safetensors.index.json.*name the one"):
        open_file(f)


def test_not_a_model_folder(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(FormatError, match="not a model folder"):
        open_file(tmp_path)


def test_tensor_in_two_shards(tmp_path: Path, st_folder: Path) -> None:
    f = _copy(st_folder, tmp_path / "m")
    (f / "model-00006-of-00005.safetensors").write_bytes((f / "model-00001-of-00005.safetensors").read_bytes())
    with pytest.raises(FormatError, match=r"tensor 'embeddings.word_embeddings.weight' is in two shards: "
                                          r".*model-00001-of-00005.safetensors and .*model-00006-of-00005"):
        open_file(f / "model-*.safetensors")


def test_index_names_a_missing_shard(tmp_path: Path, st_folder: Path) -> None:
    f = _copy(st_folder, tmp_path / "m")
    (f / "model-00003-of-00005.safetensors").unlink()
    with pytest.raises(FormatError, match=r"model.safetensors.index.json: shard .*model-00003-of-00005.safetensors "
                                          r"named by the index is missing"):
        open_file(f)


def test_index_entry_the_shard_lacks(tmp_path: Path, st_folder: Path) -> None:
    f = _copy(st_folder, tmp_path / "m")
    data = _index(f)
    data["weight_map"]["ghost.weight"] = "model-00002-of-00005.safetensors"  # type: ignore[index]
    _write_index(f, data)
    with pytest.raises(FormatError, match=r"index puts tensor 'ghost.weight' in .*model-00002-of-00005.safetensors, "
                                          r"which does not hold it"):
        open_file(f)


def test_index_entry_in_the_wrong_shard(tmp_path: Path, st_folder: Path) -> None:
    f = _copy(st_folder, tmp_path / "m")
    data = _index(f)
    data["weight_map"]["embeddings.LayerNorm.bias"] = "model-00003-of-00005.safetensors"  # type: ignore[index]
    _write_index(f, data)
    with pytest.raises(FormatError, match=r"index puts tensor 'embeddings.LayerNorm.bias' in "
                                          r".*model-00003-of-00005.safetensors, but it is in .*model-00002"):
        open_file(f)


def test_shard_tensor_not_in_index(tmp_path: Path, st_folder: Path) -> None:
    f = _copy(st_folder, tmp_path / "m")
    data = _index(f)
    del data["weight_map"]["pooler.dense.bias"]  # type: ignore[attr-defined]
    _write_index(f, data)
    with pytest.raises(FormatError, match=r"shard .*model-0000\d-of-00005.safetensors holds tensor "
                                          r"'pooler.dense.bias', which the index does not list"):
        open_file(f)


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "index is not JSON"),
    ('{"metadata": {}}', "not an index"),
    ('{"weight_map": {"a": 3}}', "not an index"),
    ("[1, 2]", "not an index"),
])
def test_bad_index(tmp_path: Path, st_folder: Path, text: str, message: str) -> None:
    f = _copy(st_folder, tmp_path / "m")
    (f / "model.safetensors.index.json").write_text(text)
    with pytest.raises(FormatError, match=r"model.safetensors.index.json: " + message):
        open_file(f)


@pytest.mark.parametrize("bad", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_index_path_leaving_the_folder(tmp_path: Path, st_folder: Path, bad: str) -> None:
    f = _copy(st_folder, tmp_path / "m")
    (tmp_path / "outside.safetensors").write_bytes((f / "model-00001-of-00005.safetensors").read_bytes())
    data = _index(f)
    data["weight_map"]["embeddings.word_embeddings.weight"] = bad  # type: ignore[index]
    _write_index(f, data)
    with pytest.raises(FormatError, match=rf"shard path '{bad}' leaves the index's folder"):
        open_file(f)


def test_index_symlink_leaving_the_folder(tmp_path: Path, st_folder: Path) -> None:
    f = _copy(st_folder, tmp_path / "m")
    (tmp_path / "outside.safetensors").write_bytes((f / "model-00001-of-00005.safetensors").read_bytes())
    (f / "model-00001-of-00005.safetensors").unlink()
    (f / "model-00001-of-00005.safetensors").symlink_to(tmp_path / "outside.safetensors")
    with pytest.raises(FormatError, match=r"leaves the index's folder .* \(it resolves to"):
        open_file(f)


def test_mixed_formats(tmp_path: Path, st_folder: Path, bin_folder: Path) -> None:
    f = tmp_path / "mixed"
    f.mkdir()
    (f / "a-1.ckpt").write_bytes((bin_folder / sorted(p.name for p in bin_folder.glob("*.bin"))[0]).read_bytes())
    (f / "a-2.ckpt").write_bytes((st_folder / "model-00002-of-00005.safetensors").read_bytes())
    with pytest.raises(FormatError, match=r"mixed formats in one source: .*a-1.ckpt is pytorch, .*a-2.ckpt is "
                                          r"safetensors"):
        open_file(f / "a-*.ckpt")


def test_glob_matching_nothing(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no file matches this glob"):
        open_file(tmp_path / "model-*.safetensors")


def _fds(folder: Path) -> int:
    """This process's open descriptors on files in `folder`. Only those: other tests that ran in this
    process may leave servers, threads or garbage whose descriptors close at any moment."""
    top = str(folder.resolve()) + os.sep
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own descriptor, a thread's)
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(top)
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_many_shards_hold_few_descriptors(tmp_path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    n = 300
    rng = np.random.default_rng(1)
    weight_map = {}
    arrays = {}
    for i in range(n):
        name = f"layer.{i}.weight"
        arrays[name] = rng.standard_normal((4, 3)).astype(np.float32)
        shard = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({name: arrays[name]}, str(tmp_path / shard))
        weight_map[name] = shard
    _write_index(tmp_path, {"metadata": {"total_size": 48 * n}, "weight_map": weight_map})
    assert _fds(tmp_path) == 0
    with open_file(tmp_path) as r:
        assert _fds(tmp_path) <= 1
        most = 0
        for t in r.tensors:
            assert np.array_equal(t.numpy(), arrays[t.name])
            most = max(most, _fds(tmp_path))
        assert most <= 5
        # every shard holds one tensor at the same offset: the descriptor numbers the writers see are
        # reused from shard to shard, and must never make two tensors look like one (PyTorch ties)
        for name in ("one.pt", "one.safetensors", "one.bpk"):
            save(list(r.tensors), tmp_path / name)
            assert len(r.fds) <= OPEN_SHARDS + 1
            with open_file(tmp_path / name) as out:
                assert len(out) == n
                for t in out.tensors:
                    assert np.array_equal(t.numpy(), arrays[t.name]), (name, t.name)
    assert _fds(tmp_path) == 0


def test_cli_inspect_folder_shows_shards(st_folder: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "migrator.cli", "inspect", str(st_folder), "--json"],
                         capture_output=True, text=True, env=env, check=True).stdout
    info = json.loads(out)
    index = _index(st_folder)["weight_map"]
    assert {t["name"]: os.path.basename(t["file"]) for t in info["tensors"]} == index
    assert len(info["details"]["shards"]) == 5
    text = subprocess.run([sys.executable, "-m", "migrator.cli", "inspect", str(st_folder)],
                          capture_output=True, text=True, env=env, check=True).stdout
    assert "shard" in text and "5 shards" in text


def test_cli_bad_index_exits_1(tmp_path: Path, st_folder: Path) -> None:
    f = _copy(st_folder, tmp_path / "m")
    (f / "model.safetensors.index.json").write_text("{")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "migrator.cli", "convert", str(f), str(tmp_path / "o.bpk")],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 1 and "index is not JSON" in p.stderr
    assert not (tmp_path / "o.bpk").exists()


def test_shards_read_by_two_threads(tmp_path: Path) -> None:
    """A cast to F16 computes the float tensors on the writer's look-ahead thread while the int ones
    are copied in the kernel on the writer's: both open and close shard descriptors at once."""
    import numpy as np
    from safetensors.numpy import save_file

    from migrator.run.convert import convert

    rng = np.random.default_rng(2)
    arrays = {}
    for i in range(3 * OPEN_SHARDS):
        shard = {f"l{i}.w": rng.standard_normal(80_000).astype(np.float32),
                 f"l{i}.n": rng.integers(0, 1000, 80_000).astype(np.int32)}
        save_file(shard, str(tmp_path / f"m-{i:03d}.safetensors"))
        arrays.update(shard)
    out = tmp_path / "out.bpk"
    convert(str(tmp_path / "m-*.safetensors"), str(out), dtype="F16", progress=False)
    with open_file(out) as r:
        assert sorted(r.names()) == sorted(arrays)
        for t in r.tensors:
            want = arrays[t.name]
            assert np.array_equal(t.numpy(), want.astype(np.float16) if want.dtype == np.float32 else want), t.name


def test_read_after_close_is_an_error(st_folder: Path) -> None:
    r = open_file(st_folder)
    t = r.tensors[0]
    r.close()
    with pytest.raises(ReaderClosedError, match="its reader was closed") as e:
        t.data()
    assert e.value.tensor == t.name


def test_a_shard_being_read_is_never_the_target(tmp_path: Path, st_folder: Path) -> None:
    from migrator.core.errors import SameFileError

    f = _copy(st_folder, tmp_path / "m")
    before = (f / "model-00002-of-00005.safetensors").read_bytes()
    for src in (f, f / "model.safetensors.index.json", f / "model-*.safetensors"):
        with pytest.raises(SameFileError, match="refusing to write onto a file being read"):
            from migrator.run.convert import convert

            convert(str(src), str(f / "model-00002-of-00005.safetensors"), overwrite=True, progress=False)
    assert (f / "model-00002-of-00005.safetensors").read_bytes() == before


def test_gpt2_shards_equal_torch(tmp_path: Path) -> None:
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = transformers.GPT2Model(cfg).eval()
    model.save_pretrained(tmp_path, max_shard_size="15KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    for src in (tmp_path, tmp_path / "model.safetensors.index.json", tmp_path / "model-*.safetensors"):
        with open_file(src) as r:
            _check_equal(r, model.state_dict())

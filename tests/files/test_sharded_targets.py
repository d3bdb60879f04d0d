"""Sharded targets: Hugging Face's folder layout, split as huggingface_hub splits, loadable by transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
hf_serialization = pytest.importorskip("huggingface_hub.serialization")

from migrator.core.errors import OutputError, PlanError, TargetExistsError  # noqa: E402
from migrator.core.tensor import from_numpy  # noqa: E402
from migrator.files.io import open_file  # noqa: E402
from migrator.files.sharded_writer import FolderLayout, ShardedWriter, parse_size, split_shards  # noqa: E402
from tests.support.cli import migrate_in_process  # noqa: E402
from tests.support.models import tiny_bert  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def migrate(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`migrate ARGS` in this process (a subprocess per call would double these tests' time)."""
    p = migrate_in_process(*args)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_cli_subprocess_writes_a_folder(tmp_path: Path, small_src: Path) -> None:
    subprocess.run([sys.executable, "-m", "migrator.cli", "convert", str(small_src), f"{tmp_path}/o/",
                    "--max-shard-size", "100"], env=ENV, check=True, capture_output=True)
    assert len(list((tmp_path / "o").glob("model-*-of-00003.safetensors"))) == 3


@pytest.mark.parametrize("text", ["5GB", "20KB", "1MB", "3TB", "100KB", "7 MB"])
def test_decimal_sizes_as_huggingface_hub(text: str) -> None:
    from huggingface_hub.serialization._base import parse_size_to_int

    assert parse_size(text) == parse_size_to_int(text)


@pytest.mark.parametrize("text", ["5GiB", "20KiB", "3MiB", "5GB", "20KB"])
def test_binary_sizes_as_transformers(text: str) -> None:
    from transformers.utils.hub import convert_file_size_to_int

    assert parse_size(text) == convert_file_size_to_int(text)


@pytest.mark.parametrize("bad", ["5Gb", "-3", "0", "lots", "5 GBB"])
def test_bad_sizes(bad: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("limit", [1, 100, 1000, 4000, "5KB", 10**9])
def test_split_equals_huggingface_hub(seed: int, limit: int | str) -> None:
    rng = np.random.default_rng(seed)
    arrays = {f"t{i}.{rng.integers(1000)}": np.zeros(int(rng.integers(0, 700)), dtype=np.float32)
              for i in range(int(rng.integers(1, 40)))}
    names = list(arrays)
    rng.shuffle(names)  # an order that is not sorted
    state = {n: torch.from_numpy(arrays[n]) for n in names}
    expected = hf_serialization.split_torch_state_dict_into_shards(state, max_shard_size=limit)
    lazy = [from_numpy(n, arrays[n]) for n in names]
    writer = ShardedWriter("safetensors", lazy, folder=FolderLayout(max_size=limit))
    got = {name: [t.name for t in w.tensors] for name, w in writer.files}
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in expected.filename_to_tensors.items()}
    assert [t.name for group in split_shards(lazy, parse_size(limit)) for t in group] != [] or not names
    if expected.is_sharded:
        assert writer.index is not None
        assert writer.index["weight_map"] == expected.tensor_to_filename
        # huggingface_hub's split gives total_size; the index also has transformers' total_parameters
        assert writer.index["metadata"]["total_size"] == expected.metadata["total_size"]
        assert writer.index["metadata"]["total_parameters"] == sum(a.size for a in arrays.values())
    else:
        assert writer.index is None




@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    model = tiny_bert()
    out = tmp_path_factory.mktemp("bert") / "src"
    model.save_pretrained(out, max_shard_size="20KB")  # type: ignore[attr-defined]
    return model, out


def _outputs(model: object) -> object:
    ids = torch.tensor([[1, 5, 7, 3, 2, 9]])
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state  # type: ignore[operator]


def _tensor_bytes(folder_or_file: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    with open_file(folder_or_file) as r:
        return {t.name: (t.dtype.display, t.shape, bytes(t.data())) for t in r.tensors}


@pytest.mark.parametrize("limit", ["30KB", "13000", "1GB"])
def test_sharded_output_loads_in_transformers(tmp_path: Path, bert_folder: tuple[object, Path], limit: str) -> None:
    model, src = bert_folder
    out = tmp_path / "out"
    migrate("convert", str(src), f"{out}/", "--max-shard-size", limit, "--copy", "config.json", "--no-progress")
    # the split huggingface_hub makes for the same tensors, in the order migrator writes them
    with open_file(src) as r:
        order = r.names()
    state = model.state_dict()  # type: ignore[attr-defined]
    split = hf_serialization.split_torch_state_dict_into_shards({n: state[n] for n in order},
                                                                max_shard_size=int(limit) if limit.isdigit() else limit)
    files = sorted(p.name for p in out.iterdir())
    expected_files = sorted([*split.filename_to_tensors, "config.json"]
                            + (["model.safetensors.index.json"] if split.is_sharded else []))
    assert files == expected_files
    if split.is_sharded:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert index["weight_map"] == split.tensor_to_filename
        assert index["metadata"]["total_size"] == split.metadata["total_size"]
    assert (out / "config.json").read_bytes() == (src / "config.json").read_bytes()
    loaded = transformers.AutoModel.from_pretrained(out).eval()
    assert torch.equal(_outputs(loaded), _outputs(model))


def test_pytorch_shards(tmp_path: Path, bert_folder: tuple[object, Path]) -> None:
    model, src = bert_folder
    out = tmp_path / "out"
    migrate("convert", str(src), str(out), "--max-shard-size", "20KB", "--to", "pytorch", "--copy", "config.json",
            "--no-progress")
    index = json.loads((out / "pytorch_model.bin.index.json").read_text())
    state = model.state_dict()  # type: ignore[attr-defined]
    assert sorted(index["weight_map"]) == sorted(state)
    seen = {}
    for shard in sorted(set(index["weight_map"].values())):
        assert shard.startswith("pytorch_model-") and shard.endswith(".bin")
        seen.update(torch.load(out / shard, weights_only=True))
    assert sorted(seen) == sorted(state)
    for k, v in state.items():
        assert torch.equal(seen[k], v), k
    loaded = transformers.AutoModel.from_pretrained(out).eval()
    assert torch.equal(_outputs(loaded), _outputs(model))


def test_folder_to_bpk_to_folder_is_bit_identical(tmp_path: Path, bert_folder: tuple[object, Path]) -> None:
    _, src = bert_folder
    migrate("convert", str(src), str(tmp_path / "one.bpk"), "--no-progress")
    migrate("convert", str(tmp_path / "one.bpk"), str(tmp_path / "again") + "/", "--max-shard-size", "20KB",
            "--no-progress")
    assert _tensor_bytes(tmp_path / "again") == _tensor_bytes(src)
    assert len(list((tmp_path / "again").glob("model-*.safetensors"))) == len(list(src.glob("model-*.safetensors")))


def test_from_burnpack_with_burn_to_pytorch(tmp_path: Path, bert_folder: tuple[object, Path]) -> None:
    model, src = bert_folder
    burn = tmp_path / "burn"
    burn.mkdir()
    (burn / "config.json").write_bytes((src / "config.json").read_bytes())
    migrate("convert", str(src), str(burn / "bert.bpk"), "--adapter", "pytorch_to_burn", "--no-progress")
    out = tmp_path / "hf"
    migrate("convert", str(burn / "bert.bpk"), f"{out}/", "--adapter", "burn_to_pytorch", "--max-shard-size", "25KB",
            "--copy", "config.json", "--no-progress")
    loaded = transformers.AutoModel.from_pretrained(out).eval()
    assert torch.equal(_outputs(loaded), _outputs(model))


def _recipe(tmp_path: Path, target: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"version: 1\nsource: {{path: src.safetensors}}\ntarget:\n{target}\n")
    return path


@pytest.fixture
def small_src(tmp_path: Path) -> Path:
    from safetensors.numpy import save_file

    save_file({f"w{i}": np.full((10,), i, np.float32) for i in range(6)}, str(tmp_path / "src.safetensors"))
    return tmp_path / "src.safetensors"


def test_sharded_bpk_is_a_recipe_error(tmp_path: Path, small_src: Path) -> None:
    r = _recipe(tmp_path, "  path: out.bpk\n  shard: {max_size: 100}")
    p = migrate("run", str(r), check=False)
    assert p.returncode == 2
    assert "a sharded target cannot be burnpack: Burn has one file per model" in p.stderr
    r = _recipe(tmp_path, "  path: out/\n  format: burnpack")
    p = migrate("run", str(r), check=False)
    assert p.returncode == 2 and "Burn has one file per model" in p.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.bpk").exists()


def test_copy_needs_a_folder_target(tmp_path: Path, small_src: Path) -> None:
    p = migrate("run", str(_recipe(tmp_path, "  path: out.safetensors\n  copy: [config.json]")), check=False)
    assert p.returncode == 2 and "target.copy needs a folder target" in p.stderr


def test_missing_copy_is_an_error_unless_optional(tmp_path: Path, small_src: Path) -> None:
    p = migrate("run", str(_recipe(tmp_path, "  path: out/\n  copy: [config.json]")), check=False)
    assert p.returncode == 1 and "target.copy: no file in" in p.stderr and "matches 'config.json'" in p.stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "tokenizer.json").write_text('{"a": 1}')
    (tmp_path / "tokenizer_config.json").write_text("{}")
    migrate("run", str(_recipe(tmp_path, "  path: out/\n  shard: {max_size: 80}\n  copy: ['tokenizer*', "
                                         "{path: config.json, optional: true}]")))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
        "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]
    assert (tmp_path / "out" / "tokenizer.json").read_text() == '{"a": 1}'


def test_copy_may_not_leave_the_source_folder(tmp_path: Path, small_src: Path) -> None:
    p = migrate("run", str(_recipe(tmp_path, "  path: out/\n  copy: ['../x.json']")), check=False)
    assert p.returncode == 1 and "leaves the source folder" in p.stderr


def test_one_shard_is_one_file_without_index(tmp_path: Path, small_src: Path) -> None:
    migrate("run", str(_recipe(tmp_path, "  path: out/")))
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["model.safetensors"]


def test_existing_folder_refused_without_overwrite(tmp_path: Path, small_src: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors").write_bytes(b"old")
    p = migrate("run", str(_recipe(tmp_path, "  path: out/")), check=False)
    assert p.returncode == 1 and "already exists; to replace it pass --overwrite" in p.stderr
    assert "Successfully" not in p.stdout  # refused before the report
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == b"old"
    migrate("run", str(_recipe(tmp_path, "  path: out/\n  shard: {max_size: 100}")), "--overwrite")
    assert len(list((tmp_path / "out").glob("model-*-of-00003.safetensors"))) == 3
    assert not (tmp_path / "out" / "model.safetensors").exists()  # replaced whole, not merged
    assert [p.name for p in tmp_path.iterdir() if "migrator-" in p.name] == []


def test_target_folder_and_parents_are_created(tmp_path: Path, small_src: Path) -> None:
    migrate("run", str(_recipe(tmp_path, "  path: a/b/out/")))
    assert (tmp_path / "a" / "b" / "out" / "model.safetensors").is_file()


def test_overwrite_refuses_a_folder_without_model_files(tmp_path: Path, small_src: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    p = migrate("run", str(_recipe(tmp_path, "  path: out/")), "--overwrite", check=False)
    assert p.returncode == 1 and "not part of a model folder (notes.txt)" in p.stderr
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_target_that_is_a_file(tmp_path: Path, small_src: Path) -> None:
    (tmp_path / "out").write_text("a file")
    p = migrate("run", str(_recipe(tmp_path, "  path: out/")), "--overwrite", check=False)
    assert p.returncode == 1 and "is not a folder" in p.stderr


def test_python_api_errors(tmp_path: Path) -> None:
    from migrator.storage.atomic_folder import check_folder_target

    (tmp_path / "m").mkdir()
    with pytest.raises(TargetExistsError):
        check_folder_target(tmp_path / "m", overwrite=False)
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="not a folder"):
        check_folder_target(tmp_path / "f", overwrite=True)
    with pytest.raises(PlanError, match="Burn has one file per model"):
        ShardedWriter("burnpack", [])


def test_python_save_writes_a_folder(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    from migrator import save

    arrays = {f"w{i}": np.full((25,), i, np.float32) for i in range(5)}
    save([from_numpy(k, v) for k, v in arrays.items()], tmp_path / "m", max_shard_size=200)
    index = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    got = {}
    for shard in set(index["weight_map"].values()):
        got.update(load_file(str(tmp_path / "m" / shard)))
    assert sorted(got) == sorted(arrays) and all(np.array_equal(got[k], arrays[k]) for k in arrays)
    assert len(set(index["weight_map"].values())) == 3  # 100 bytes each, two per 200-byte shard


def test_convert_refuses_an_existing_folder_before_reading(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    p = migrate("convert", str(tmp_path / "no-such-source"), f"{tmp_path}/out/", "--max-shard-size", "5GB",
                check=False)
    assert p.returncode == 1 and "already exists; to replace it pass --overwrite" in p.stderr


def test_template_may_be_a_folder(tmp_path: Path, small_src: Path) -> None:
    from safetensors.numpy import load_file

    migrate("convert", str(small_src), f"{tmp_path}/tpl/", "--max-shard-size", "100")
    migrate("run", str(_recipe(tmp_path, "  path: out.safetensors\n  template: tpl/")))
    got = load_file(str(tmp_path / "out.safetensors"))
    assert sorted(got) == [f"w{i}" for i in range(6)] and np.array_equal(got["w3"], np.full((10,), 3, np.float32))


def test_top_level_key_on_a_sharded_source(tmp_path: Path, small_src: Path) -> None:
    from migrator.files.io import save

    save([from_numpy(f"model.w{i}", np.full((10,), i, np.float32)) for i in range(4)], tmp_path / "m",
         max_shard_size=80)
    with open_file(tmp_path / "m", top_level_key="model") as r:
        assert r.names() == ["w0", "w1", "w2", "w3"]
        assert [len(set(r.file_of(i) for i in range(4)))] == [2]


@pytest.mark.parametrize("exchange", [True, False])
def test_overwrite_replaces_the_folder_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool) -> None:
    """With renameat2 (swap) and without it (the old folder renamed aside first, as on other systems)."""
    import migrator.storage.atomic_folder as af
    from migrator.files.io import save

    if not exchange:
        monkeypatch.setattr(af, "_renameat2", lambda *a: False)
    old = [from_numpy(f"old{i}", np.zeros(30, np.float32)) for i in range(4)]
    new = [from_numpy(f"new{i}", np.ones(30, np.float32)) for i in range(2)]
    save(old, tmp_path / "m", max_shard_size=200)
    assert len(list((tmp_path / "m").glob("model-*-of-00004.safetensors"))) == 4
    with pytest.raises(TargetExistsError):
        save(new, tmp_path / "m", max_shard_size=200)
    save(new, tmp_path / "m", max_shard_size=200, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    with open_file(tmp_path / "m") as r:
        assert r.names() == ["new0", "new1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # the old folder is gone, no scratch left


def test_validate_and_plan_check_a_folder_target_as_the_run_would(tmp_path: Path, small_src: Path) -> None:
    """An existing output folder: refused without overwrite, fine with it (the folder publish's own
    rule), never the single-file "the target is a folder"."""
    migrate("run", str(_recipe(tmp_path, "  path: out/\n  shard: {max_size: 100}")))
    assert (tmp_path / "out").is_dir()
    p = migrate("validate", str(tmp_path / "r.yaml"), check=False)
    assert p.returncode == 1 and "already exists; to replace it pass --overwrite" in p.stderr, p.stderr
    assert migrate("validate", str(tmp_path / "r.yaml"), "--overwrite").returncode == 0
    _recipe(tmp_path, "  path: out/\n  shard: {max_size: 100}\n  overwrite: true")
    for command in ("validate", "plan"):
        p = migrate(command, str(tmp_path / "r.yaml"), check=False)
        assert p.returncode == 0 and "is a folder" not in p.stderr, (command, p.stderr)

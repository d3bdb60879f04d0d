"""DeepSpeed ZeRO-1/2/3 checkpoint folders consolidate exactly as DeepSpeed's own `zero_to_fp32` does.

The checkpoints are written in the test by DeepSpeed itself (`tests/support/zero_run.py`: 2 ranks on gloo,
CPU, fp32 and bf16, stages 1, 2 and 3, a frozen layer, a buffer, tied weights, two parameter
groups). Oracles: `deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint` for the
fp32 masters, `torch.load` of the model states file for the module weights, the `safetensors`
library for what migrator wrote.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process

os.environ.setdefault("DS_ACCELERATOR", "cpu")
torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
st_torch = pytest.importorskip("safetensors.torch")
zero_to_fp32 = pytest.importorskip("deepspeed.utils.zero_to_fp32")

import tests.support.zero_run as zero_run  # noqa: E402

CONFIGS = [f"z{c[0]}_{c[2:]}" for c in zero_run.CONFIGS]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zero")
    done = zero_run.write_checkpoints(out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def oracle(folder: Path, tag: str | None = None) -> dict[str, Any]:
    return dict(zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=tag))


def bits(t: Any) -> Any:
    """A tensor's raw bits, so that equality is bit for bit (NaNs and -0.0 included)."""
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}.get(t.dtype)
    return t.contiguous().view(view) if view is not None else t


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and tuple(g.shape) == tuple(w.shape), name
        assert torch.equal(bits(g), bits(w)), name


def convert(src: Path | str, out: Path, *extra: str) -> dict[str, Any]:
    p = migrate_in_process("convert", str(src), str(out), *extra)
    assert p.returncode == 0, p.stderr
    return dict(st_torch.load_file(str(out)))


@pytest.mark.parametrize("config", CONFIGS)
def test_consolidated_masters_equal_zero_to_fp32(ckpts: Path, tmp_path: Path, config: str) -> None:
    want = oracle(ckpts / config)
    assert_same(convert(ckpts / config, tmp_path / "out.safetensors"), want)
    from migrator.files.io import open_file

    with open_file(ckpts / config) as reader:  # the very order zero_to_fp32 lists them in
        assert reader.names() == list(want)
        assert reader.stage == int(config[1])


@pytest.mark.parametrize("config", ["z1_bf16", "z3_fp32"])
def test_the_tag_or_the_step_folder_picks_the_step(ckpts: Path, tmp_path: Path, config: str) -> None:
    first, last = oracle(ckpts / config, "global_step1"), oracle(ckpts / config)
    assert not torch.equal(first["a.weight"], last["a.weight"])  # two steps apart: the pick is seen
    assert_same(convert(ckpts / config, tmp_path / "1.safetensors", "--tag", "global_step1"), first)
    assert_same(convert(ckpts / config / "global_step1", tmp_path / "d.safetensors"), first)
    assert_same(convert(ckpts / config / "global_step2", tmp_path / "2.safetensors"), last)


def test_a_recipe_names_the_step_with_source_tag(ckpts: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    out = tmp_path / "r.safetensors"
    recipe.write_text(f"version: 1\nsource:\n  path: {ckpts / 'z2_fp32'}\n  tag: global_step1\n"
                      f"target:\n  path: {out}\n")
    p = migrate_in_process("run", str(recipe))
    assert p.returncode == 0, p.stderr
    assert_same(dict(st_torch.load_file(str(out))), oracle(ckpts / "z2_fp32", "global_step1"))


@pytest.mark.parametrize("config", ["z1_bf16", "z2_bf16", "z1_fp32"])
def test_module_weights_equal_the_model_states_module(ckpts: Path, tmp_path: Path, config: str) -> None:
    step = ckpts / config / "global_step2"
    module = torch.load(step / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    got = convert(ckpts / config, tmp_path / "m.safetensors", "--top-level-key", "module")
    assert_same(got, dict(module))
    if config.endswith("bf16"):
        assert got["a.weight"].dtype == torch.bfloat16


def test_zero3_module_weights_are_refused_as_partitioned(ckpts: Path, tmp_path: Path) -> None:
    p = migrate_in_process("convert", str(ckpts / "z3_bf16"), str(tmp_path / "m.safetensors"),
                           "--top-level-key", "module")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "ZeRO-3" in p.stderr and "zero_pp_rank_0_mp_rank_00_model_states.pt" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m.safetensors").exists()


def test_each_parameter_reads_only_its_own_bytes(ckpts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamed: the bytes read from the optimizer partitions are those of the parameters, never a
    whole flat group (the groups also hold the partitions' padding and other parameters)."""
    read = zero_run.count_partition_reads(monkeypatch)
    want = oracle(ckpts / "z3_fp32")
    convert(ckpts / "z3_fp32", tmp_path / "o.safetensors")
    # every tensor but the buffer (read from the model states file), the tied h.weight read again as itself
    assert sorted(read) == sorted(t.numel() * 4 for n, t in want.items() if n != "scale")


def test_inspect_shows_stage_ranks_and_pieces(ckpts: Path) -> None:
    p = migrate_in_process("inspect", str(ckpts / "z3_fp32"), "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["format"] == "deepspeed"
    details = info["details"]
    assert details["zero_stage"] == 3 and details["world_size"] == 2 and details["tag"] == "global_step2"
    assert {r for r, *_ in details["partitions"]["a.weight"]} == {0, 1}  # 35 elements: 18 on rank 0, 17 on rank 1
    shapes = {t["name"]: t["shape"] for t in info["tensors"]}
    assert shapes["a.weight"] == [5, 7]

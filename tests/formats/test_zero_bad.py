"""Broken and hostile ZeRO checkpoints through the command line: exit 1, one line naming the file
(and the tensor where there is one), no traceback, nothing written, no code run.

Each case starts from a checkpoint DeepSpeed wrote (`tests/support/zero_run.py`) and breaks one thing: a
truncated partition file, a missing or extra rank, shapes that disagree with the partitions, a
`latest` naming no step, a state file whose pickle calls `os.system`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

os.environ.setdefault("DS_ACCELERATOR", "cpu")
torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

import tests.support.zero_run as zero_run  # noqa: E402


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zero")
    done = zero_run.write_checkpoints(out, ("1:fp32", "3:fp32"))
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.fixture
def z3(ckpts: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(ckpts / "z3_fp32", tmp_path / "ckpt"))


@pytest.fixture
def z1(ckpts: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(ckpts / "z1_fp32", tmp_path / "ckpt"))


def refused(src: Path, *extra: str) -> str:
    out = src.parent / "out.safetensors"
    p = migrate_in_process("convert", str(src), str(out), *extra)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not out.exists()
    assert not [n for n in os.listdir(src.parent) if n.startswith(".") or n.endswith((".tmp", ".partial"))]
    return p.stderr


def step(ckpt: Path) -> Path:
    return ckpt / "global_step2"


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_a_truncated_partition_names_its_file(z3: Path, keep: float) -> None:
    victim = step(z3) / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    os.truncate(victim, int(victim.stat().st_size * keep))
    assert victim.name in refused(z3)


def test_a_partition_truncated_after_opening_names_file_and_tensor(z3: Path, tmp_path: Path) -> None:
    from migrator.core.errors import FormatError
    from migrator.files.io import open_file

    victim = step(z3) / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    with open_file(z3) as reader:
        os.truncate(victim, victim.stat().st_size - 10)
        with pytest.raises(FormatError) as e:
            reader["a.weight"].data()
    assert e.value.file == str(victim) and e.value.tensor == "a.weight"


@pytest.mark.parametrize("rank", [0, 1])
def test_a_missing_rank_is_named(z3: Path, rank: int) -> None:
    (step(z3) / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").unlink()
    err = refused(z3)
    assert f"rank {rank}" in err and f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt is missing" in err


def test_a_missing_zero3_model_states_rank_is_named(z3: Path) -> None:
    (step(z3) / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    assert "rank 1's model states file" in refused(z3)


def test_an_extra_rank_is_refused(z3: Path) -> None:
    shutil.copy(step(z3) / "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                step(z3) / "zero_pp_rank_2_mp_rank_00_optim_states.pt")
    assert "rank 2" in refused(z3)


@pytest.mark.parametrize("stage", [1, 3])
@pytest.mark.parametrize("shape", [(5, 9), (5, 6), (2, 3)])
def test_shapes_that_disagree_with_the_partitions_are_refused(ckpts: Path, tmp_path: Path, stage: int,
                                                              shape: tuple[int, ...]) -> None:
    ckpt = Path(shutil.copytree(ckpts / f"z{stage}_fp32", tmp_path / "ckpt"))
    name = "mp_rank_00_model_states.pt" if stage == 1 else "zero_pp_rank_0_mp_rank_00_model_states.pt"
    states = torch.load(step(ckpt) / name, weights_only=False)
    states["param_shapes"][0]["a.weight"] = torch.Size(shape)
    torch.save(states, step(ckpt) / name)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with pytest.raises((ValueError, RuntimeError)):  # DeepSpeed's own tool refuses them too
        get_fp32_state_dict_from_zero_checkpoint(str(ckpt))
    err = refused(ckpt)
    assert "partitions" in err and str(step(ckpt)) in err


def test_latest_naming_no_step_and_a_bad_tag(z3: Path) -> None:
    (z3 / "latest").write_text("global_step9")
    assert "no step folder 'global_step9'" in refused(z3)
    assert "not the name of a folder" in refused(z3, "--tag", "../ckpt")
    (z3 / "latest").unlink()
    assert "--tag" in refused(z3)


def test_a_tag_on_a_plain_file_is_refused(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.torch")
    st.save_file({"w": torch.ones(2)}, str(tmp_path / "m.safetensors"))
    assert "--tag" in refused(tmp_path / "m.safetensors", "--tag", "global_step1")


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("victim", ["zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                    "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                                    "zero_pp_rank_0_mp_rank_00_model_states.pt"])
def test_a_state_file_that_calls_os_system_runs_nothing(z3: Path, tmp_path: Path, victim: str) -> None:
    marker = tmp_path / "pwned"
    path = step(z3) / victim
    states = torch.load(path, weights_only=False)
    key = "optimizer_state_dict" if "optim" in victim else "param_shapes"
    states[key] = _Evil(marker)
    torch.save(states, path)
    err = refused(z3)
    assert victim in err and ("os.system" in err or "posix.system" in err)
    assert not marker.exists()

"""Every output a job writes is guarded, not only its target: hostile `migrate run` lines of several
jobs (several recipes, `--each`, `--jobs`) whose Burn optimizer records (a `.bpk` target with
`training_state: keep` also writes `target.optimizer`, default `<stem>-optim.bpk`) land on another
job's source, model or record, by path or by inode; a `--report` onto a record; a single run whose
record is its own source or its report; and `convert` into an existing folder named like a file.

Each case is held to the promises of `hostile.refused`: exit 1 or 2, one line naming the
files, no traceback, nothing written (the folder byte for byte as before), bounded time. The
checkpoints are real torch training checkpoints (AdamW after one step); the oracle of "nothing
happened" is the folder's own snapshot.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support.hostile import refused

torch = pytest.importorskip("torch")


def checkpoint(path: Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(net.parameters(), foreach=False)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, path)


def keep_recipe(folder: Path, name: str, source: str, target: str, optimizer: str | None = None) -> str:
    extra = f", optimizer: '{optimizer}'" if optimizer else ""
    (folder / name).write_text(f"version: 1\nsource: {{path: '{source}', top_level_key: model}}\n"
                               f"training_state: keep\ntarget: {{path: '{target}'{extra}}}\n")
    return str(folder / name)


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    checkpoint(tmp_path / "a.pt", 0)
    checkpoint(tmp_path / "b.pt", 1)
    save_file({"w": np.ones((2, 2), np.float32)}, str(tmp_path / "w.safetensors"))
    return tmp_path


def test_a_record_onto_another_jobs_source(work: Path) -> None:
    """The corpus case: A's record replaced B's source, and B then converted it ("2 ok")."""
    a = keep_recipe(work, "a.yaml", "a.pt", "out/a.bpk", optimizer="b.pt")
    b = keep_recipe(work, "b.yaml", "b.pt", "out/b.bpk")
    refused(["run", a, b, "--jobs", "2", "--overwrite"], work, words="b.pt")


def test_a_default_record_name_onto_another_jobs_model(work: Path) -> None:
    a = keep_recipe(work, "a.yaml", "a.pt", "m.bpk")  # its record: m-optim.bpk
    b = keep_recipe(work, "b.yaml", "b.pt", "m-optim.bpk")
    refused(["run", a, b, "--jobs", "2"], work, words="two jobs write")


def test_a_default_scheduler_record_name_onto_another_jobs_model(work: Path) -> None:
    """Burn's LR scheduler record (`<stem>-scheduler.bpk`, written when the checkpoint has a scheduler
    Burn has) is one of the job's outputs too."""
    a = keep_recipe(work, "a.yaml", "a.pt", "m.bpk")  # its LR scheduler record: m-scheduler.bpk
    b = keep_recipe(work, "b.yaml", "b.pt", "m-scheduler.bpk")
    refused(["run", a, b, "--jobs", "2"], work, words="two jobs write")


def test_two_jobs_sharing_one_record(work: Path) -> None:
    a = keep_recipe(work, "a.yaml", "a.pt", "a.bpk", optimizer="shared.bpk")
    b = keep_recipe(work, "b.yaml", "b.pt", "b.bpk", optimizer="shared.bpk")
    refused(["run", a, b, "--jobs", "2"], work, words="shared.bpk")


def test_a_record_hard_linked_to_another_jobs_source(work: Path) -> None:
    os.link(work / "b.pt", work / "a-optim.bpk")
    a = keep_recipe(work, "a.yaml", "a.pt", "a.bpk")
    b = keep_recipe(work, "b.yaml", "b.pt", "b.bpk")
    refused(["run", a, b, "--jobs", "2", "--overwrite"], work, words="by inode")


def test_a_record_inside_another_jobs_folder_target(work: Path) -> None:
    a = keep_recipe(work, "a.yaml", "a.pt", "a.bpk", optimizer="d/optim.bpk")
    (work / "c.yaml").write_text("version: 1\nsource: {path: w.safetensors}\n"
                                 "target: {path: d/, shard: {max_size: 100}}\n")
    refused(["run", a, str(work / "c.yaml"), "--jobs", "2"], work, words="d/optim.bpk")


def test_each_a_default_record_onto_another_matchs_model(work: Path) -> None:
    """--each over a.pt and a-optim.pt: a.pt's record out/a-optim.bpk is a-optim.pt's model."""
    checkpoint(work / "a-optim.pt", 2)
    r = keep_recipe(work, "r.yaml", "a.pt", "x.bpk")
    refused(["run", r, "--each", "a.pt", "a-optim.pt", "--target", "out/{stem}.bpk", "--jobs", "2"],
            work, words="a-optim.bpk")


def test_each_training_state_from_the_command_line_counts_too(work: Path) -> None:
    """The recipe drops the state; `--training-state keep` makes each job write a record."""
    checkpoint(work / "a-optim.pt", 2)
    (work / "r.yaml").write_text("version: 1\nsource: {path: a.pt, top_level_key: model}\ntarget: {path: x.bpk}\n")
    refused(["run", str(work / "r.yaml"), "--each", "*.pt", "--target", "out/{stem}.bpk", "--training-state", "keep"],
            work, words="a-optim.bpk")


def test_a_report_onto_a_jobs_record(work: Path) -> None:
    a = keep_recipe(work, "a.yaml", "a.pt", "a.bpk")
    b = keep_recipe(work, "b.yaml", "b.pt", "b.bpk")
    refused(["run", a, b, "--jobs", "2", "--report", "a-optim.bpk"], work, words="--report")


def test_one_jobs_record_is_its_own_model(work: Path) -> None:
    a = keep_recipe(work, "a.yaml", "a.pt", "a.bpk", optimizer="a.bpk")
    b = keep_recipe(work, "b.yaml", "b.pt", "b.bpk")
    refused(["run", a, b, "--jobs", "2"], work, words="one file")


def test_a_single_run_whose_record_is_its_source(work: Path) -> None:
    a = keep_recipe(work, "a.yaml", "a.pt", "a.bpk", optimizer="a.pt")
    refused(["run", a, "--overwrite"], work, words="a.pt")


def test_a_single_run_whose_record_is_a_hard_link_to_its_source(work: Path) -> None:
    os.link(work / "a.pt", work / "a-optim.bpk")
    a = keep_recipe(work, "a.yaml", "a.pt", "a.bpk")
    refused(["run", a, "--overwrite"], work, words="a-optim.bpk")


def test_a_single_run_whose_report_is_its_record(work: Path) -> None:
    a = keep_recipe(work, "a.yaml", "a.pt", "a.bpk")
    refused(["run", a, "--overwrite", "--report", "a-optim.bpk"], work, words="a-optim.bpk")


def test_a_single_run_whose_report_is_its_existing_record(work: Path) -> None:
    a = keep_recipe(work, "a.yaml", "a.pt", "a.bpk")
    (work / "a-optim.bpk").write_bytes(b"an older record")
    refused(["run", a, "--overwrite", "--report", "a-optim.bpk"], work, words="a-optim.bpk")


@pytest.mark.parametrize("dst", ["out.bpk", "out.safetensors", "out.pt", "out.gguf"])
def test_convert_into_an_existing_folder_named_like_a_file(work: Path, dst: str) -> None:
    """An existing folder `out.bpk` was written into (`out.bpk/w.safetensors`): a target named like a
    file of one format never silently becomes a folder holding another."""
    (work / dst).mkdir()
    done = refused(["convert", "w.safetensors", dst], work, words="existing folder", codes=(2,))
    assert "end it with '/'" in done.stderr
    refused(["convert", "w.safetensors", dst, "--to", "burnpack", "--overwrite"], work, codes=(2,))


def test_convert_into_an_existing_folder_with_a_slash_still_works(work: Path) -> None:
    from tests.support.cli import migrate_in_process

    (work / "out.bpk").mkdir()
    done = migrate_in_process("convert", "w.safetensors", "out.bpk/")
    assert done.returncode == 0, done.stderr
    assert (work / "out.bpk" / "w.safetensors").is_file()


@pytest.mark.parametrize("record", [None, "optim-7.bpk"])
def test_convert_recipe_output_onto_the_record(work: Path, record: str | None) -> None:
    """`--emit-recipe -o` onto Burn's optimizer record (default name, or --optimizer-out) would have
    replaced the record just written (with --overwrite) or failed after writing the model."""
    target = record or "m-optim.bpk"
    extra = ["--optimizer-out", record] if record else []
    refused(["convert", "a.pt", "m.bpk", "--top-level-key", "model", "--training-state", "keep", *extra,
             "--emit-recipe", "-o", target, "--overwrite"], work, words=target)

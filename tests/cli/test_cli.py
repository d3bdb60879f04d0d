"""The `migrate` command: inspect and convert as a user runs them, exit codes, messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import migrator
from migrator import from_numpy, open_file, save
from migrator.cli import main
from migrator.core.scalars import Scalar
from tests.support.cli import migrate_subprocess

migrate = migrate_subprocess


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save([from_numpy("enc.weight", np.arange(6, dtype=np.float32).reshape(2, 3)),
          from_numpy("enc.bias", np.ones(3, ml_dtypes.bfloat16)),
          from_numpy("mask", np.array([True, False]))], path, metadata={"format": "pt"})
    return path


def test_inspect_json_lists_tensors_in_data_order(model: Path) -> None:
    out = migrate("inspect", str(model), "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["format"] == "safetensors"
    assert info["metadata"] == {"format": "pt"}
    assert info["scalars"] == {}
    by_name = {t["name"]: t for t in info["tensors"]}
    assert by_name["enc.weight"] == {"name": "enc.weight", "dtype": "F32", "shape": [2, 3], "nbytes": 24,
                                     "offset": by_name["enc.weight"]["offset"]}
    assert by_name["enc.bias"]["dtype"] == "BF16" and by_name["mask"]["dtype"] == "BOOL"
    offsets = [t["offset"] for t in info["tensors"]]
    assert offsets == sorted(offsets)
    assert info["totals"] == {"tensors": 3, "nbytes": 24 + 6 + 2}


def test_inspect_table_shows_names_dtypes_and_scalars(tmp_path: Path) -> None:
    p = tmp_path / "m.bpk"
    save([from_numpy("layers.0.linear.weight", np.zeros((4, 2), np.float16), param_id=99)], p,
         metadata={"producer": "burn"}, scalars={"epoch": Scalar("Int", 42), "loss": Scalar("Float", 0.123)})
    out = migrate("inspect", str(p))
    assert out.returncode == 0, out.stderr
    for text in ("layers.0.linear.weight", "F16", "[4, 2]", "99", "epoch", "42", "0.123", "producer", "burn"):
        assert text in out.stdout
    info = json.loads(migrate("inspect", str(p), "--json").stdout)
    assert info["scalars"] == {"epoch": {"Int": 42}, "loss": {"Float": 0.123}}
    assert info["tensors"][0]["param_id"] == 99 and info["tensors"][0]["offset"] % 256 == 0


def test_convert_round_trip_and_metadata(model: Path, tmp_path: Path) -> None:
    bpk = tmp_path / "out"
    out = migrate("convert", str(model), str(bpk))
    assert out.returncode == 0, out.stderr
    assert "out.bpk" in out.stdout
    r = open_file(tmp_path / "out.bpk")
    assert r.metadata == {"format": "burnpack", "producer": "migrator", "version": migrator.__version__}
    back = tmp_path / "back.safetensors"
    assert migrate("convert", str(tmp_path / "out.bpk"), str(back), "--no-metadata").returncode == 0
    with open_file(model) as a, open_file(back) as b:
        assert b.metadata == {}
        for t in a.tensors:
            assert bytes(t.data()) == bytes(b[t.name].data()) and t.dtype == b[t.name].dtype


def test_convert_burnpack_to_burnpack_is_byte_identical(tmp_path: Path) -> None:
    src = tmp_path / "a.bpk"
    save([from_numpy("z", np.ones(3, np.float32), param_id=5), from_numpy("a", np.zeros(2, np.int8))], src,
         metadata={"producer": "burn", "format": "burnpack", "version": "0.22.0-pre.2"},
         scalars={"step": Scalar("UInt", 7)})
    assert main(["convert", str(src), str(tmp_path / "b.bpk")]) == 0
    assert (tmp_path / "b.bpk").read_bytes() == src.read_bytes()


def test_convert_refuses_existing_target_and_keeps_it(model: Path, tmp_path: Path) -> None:
    target = tmp_path / "t.bpk"
    target.write_bytes(b"precious")
    out = migrate("convert", str(model), str(target))
    assert out.returncode == 1
    assert "already exists" in out.stderr and str(target) in out.stderr
    assert target.read_bytes() == b"precious"
    assert migrate("convert", str(model), str(target), "--overwrite").returncode == 0
    assert open_file(target).names()


def test_run_refuses_existing_target_before_its_report(model: Path, tmp_path: Path) -> None:
    """A refused run prints no summary that reads like success, only the refusal and how to override it."""
    target = tmp_path / "t.bpk"
    target.write_bytes(b"precious")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {model}}}\ntarget: {{path: {target}}}\n")
    out = migrate("run", str(recipe), "--no-progress")
    assert out.returncode == 1
    assert "already exists" in out.stderr and "--overwrite" in out.stderr
    assert "applied" not in out.stdout.lower()
    assert target.read_bytes() == b"precious"
    ok = migrate("run", str(recipe), "--no-progress", "--overwrite")
    assert ok.returncode == 0 and "applied" in ok.stdout.lower()
    assert open_file(target).names()


def test_convert_onto_itself_is_refused(model: Path) -> None:
    out = migrate("convert", str(model), str(model), "--overwrite")
    assert out.returncode == 1 and "being read" in out.stderr
    assert open_file(model).names()


def test_unsupported_dtype_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "f8.safetensors"
    save([from_numpy("scale", np.zeros(4, ml_dtypes.float8_e5m2))], src)
    out = migrate("convert", str(src), str(tmp_path / "x.bpk"))
    assert out.returncode == 1
    assert "'scale'" in out.stderr and "F8_E5M2" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f8.safetensors"]


def test_corrupt_and_unknown_files_are_clear_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.dat"
    junk.write_bytes(b"hello world, not a model")
    out = migrate("inspect", str(junk))
    assert out.returncode == 1 and "unrecognised format" in out.stderr and str(junk) in out.stderr
    missing = migrate("inspect", str(tmp_path / "nope.bpk"))
    assert missing.returncode == 1 and "cannot open" in missing.stderr
    truncated = tmp_path / "t.bpk"
    save([from_numpy("w", np.ones(1000, np.float32))], truncated)
    truncated.write_bytes(truncated.read_bytes()[:600])
    out = migrate("inspect", str(truncated))
    assert out.returncode == 1 and "truncated" in out.stderr and "'w'" in out.stderr
    assert "Traceback" not in out.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert migrate().returncode == 2
    assert migrate("convert", "only-one-arg").returncode == 2
    assert migrate("convert", "a", "b", "--metadata", "novalue").returncode == 2


def test_help_is_fast_and_does_not_import_numpy() -> None:
    code = "import sys; from migrator.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n" \
           "print('numpy' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False False")


def test_top_level_key_works_on_burnpack_too(tmp_path: Path) -> None:
    p = tmp_path / "m.bpk"
    save([from_numpy("enc.w", np.ones(2, np.float32)), from_numpy("dec.w", np.ones(2, np.float32))], p)
    out = migrate("inspect", str(p), "--top-level-key", "enc", "--json")
    assert out.returncode == 0, out.stderr
    assert [t["name"] for t in json.loads(out.stdout)["tensors"]] == ["w"]
    bad = migrate("inspect", str(p), "--top-level-key", "nope")
    assert bad.returncode == 1 and "top-level names: dec, enc" in bad.stderr and "Traceback" not in bad.stderr


def test_no_fsync_writes_the_same_file_and_reaches_the_recipe(model: Path, tmp_path: Path) -> None:
    durable, fast = tmp_path / "durable.bpk", tmp_path / "fast.bpk"
    assert main(["convert", str(model), str(durable)]) == 0
    assert main(["convert", str(model), str(fast), "--no-fsync"]) == 0
    assert fast.read_bytes() == durable.read_bytes()
    emitted = migrate("convert", str(model), str(fast), "--no-fsync", "--emit-recipe")
    assert emitted.returncode == 0 and "fsync: false" in emitted.stdout
    recipe = tmp_path / "r.yaml"
    recipe.write_text(emitted.stdout.replace(str(fast), str(tmp_path / "from-recipe.bpk")))
    assert main(["run", str(recipe), "--no-progress"]) == 0
    assert main(["run", str(recipe), "--no-progress", "--no-fsync", "--overwrite"]) == 0
    ran, want = open_file(tmp_path / "from-recipe.bpk"), open_file(durable)  # + the recipe's hash in metadata
    assert [(t.name, bytes(t.data())) for t in ran.tensors] == [(t.name, bytes(t.data())) for t in want.tensors]


def test_a_closed_pipe_stops_quietly(tmp_path: Path) -> None:
    """`migrate inspect big.safetensors | head -1`: no traceback, the shell's SIGPIPE status."""
    save([from_numpy(f"t{i:05d}", np.zeros(2, np.float32)) for i in range(20_000)], tmp_path / "many.safetensors")
    proc = subprocess.Popen([sys.executable, "-m", "migrator.cli", "inspect", str(tmp_path / "many.safetensors"),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""


def test_commands_pause_the_collector_only_while_they_run(model: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A command runs with the cyclic collector off (its objects live until it ends) and gives it
    back after, also when the run fails: a library caller's process keeps its collector."""
    import gc

    from migrator.cli import recipe as run_cli
    from migrator.run import execute

    seen: list[bool] = []
    print_outcome = run_cli.print_outcome
    monkeypatch.setattr(run_cli, "print_outcome", lambda *a, **kw: (seen.append(gc.isenabled()),
                                                                     print_outcome(*a, **kw)))
    check_plan_target = execute.check_plan_target  # a refused run stops there, before the outcome
    monkeypatch.setattr(execute, "check_plan_target", lambda plan: (seen.append(gc.isenabled()),
                                                                     check_plan_target(plan)))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {model}}}\ntarget: {{path: {tmp_path / 'out.bpk'}}}\n")
    before = gc.get_freeze_count()
    assert main(["plan", str(recipe)]) == 0
    assert main(["run", str(recipe), "--no-progress"]) == 0
    assert main(["run", str(recipe), "--no-progress"]) == 1  # the target exists: refused
    assert gc.get_freeze_count() == before and gc.isenabled()
    assert seen == [False] * 4  # plan: outcome; run: check, outcome; refused: check
    gc.disable()
    try:  # a caller that paused it itself keeps it paused
        assert main(["plan", str(recipe), "--overwrite"]) == 0
        assert not gc.isenabled()
    finally:
        gc.enable()

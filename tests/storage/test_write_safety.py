"""Every file migrator writes is safe: no write lands on a file the run reads or writes, none
replaces an existing file without --overwrite or a special file at all, permissions follow the
sources as `cp` does, and nothing is written that the format's reference loader cannot read.

Oracles: the safetensors library (reads sources and outputs), torch.load, the file bytes on disk.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from migrator.cli import main

REPO = Path(__file__).resolve().parents[2]
W = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([0.5, -1.5], dtype=np.float32)


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """src.safetensors, a template tpl.safetensors (same names, other values) and two recipes:
    plain.yaml (-> out.safetensors) and tpl.yaml (the same with the template)."""
    monkeypatch.chdir(tmp_path)
    save_file({"w": W, "b": B}, str(tmp_path / "src.safetensors"))
    save_file({"w": np.zeros((2, 3), np.float32), "b": np.zeros(2, np.float32)}, str(tmp_path / "tpl.safetensors"))
    target = "target:\n  path: out.safetensors\n"
    (tmp_path / "plain.yaml").write_text("version: 1\nsource:\n  path: src.safetensors\n" + target)
    (tmp_path / "tpl.yaml").write_text("version: 1\nsource:\n  path: src.safetensors\n" + target
                                       + "  template: tpl.safetensors\n")
    return tmp_path


def _recipe(path: Path, target: str) -> None:
    path.write_text(f"version: 1\nsource:\n  path: src.safetensors\ntarget:\n  path: {target}\n")


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["run", *args, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_output_is_source(path: Path) -> None:
    got = load_file(str(path))
    np.testing.assert_array_equal(got["w"], W)
    np.testing.assert_array_equal(got["b"], B)


# ------------------------------------------------------------------------------------------------
# issue 19 item 1: --report onto a file the run reads or writes


@pytest.mark.parametrize(("recipe", "report", "make"), [
    ("plain.yaml", "src.safetensors", None),               # the reported data-loss case
    ("tpl.yaml", "tpl.safetensors", None),                 # the template
    ("plain.yaml", "out.safetensors", None),               # the target (not there yet)
    ("plain.yaml", "./sub/../out.safetensors", "sub"),     # the target, spelled differently
    ("plain.yaml", "link.json", "symlink:src.safetensors"),
    ("plain.yaml", "hard.json", "hardlink:src.safetensors"),
    ("tpl.yaml", "link.json", "symlink:tpl.safetensors"),
    ("tpl.yaml", "hard.json", "hardlink:tpl.safetensors"),
    ("plain.yaml", "dangling.json", "symlink:out.safetensors"),  # a link to where the target will be
])
@pytest.mark.parametrize("overwrite", [False, True])
def test_report_onto_a_file_of_the_run_is_refused_before_anything_is_written(
        ws: Path, capsys: pytest.CaptureFixture[str], recipe: str, report: str, make: str | None,
        overwrite: bool) -> None:
    if make == "sub":
        (ws / "sub").mkdir()
    elif make:
        kind, to = make.split(":")
        if kind == "symlink":
            (ws / report).symlink_to(to)
        else:
            os.link(ws / to, ws / report)
    before = _bytes(ws)
    code, out, err = _run(capsys, recipe, "--report", report, *(["--overwrite"] if overwrite else []))
    assert code == 1, (out, err)
    assert "refusing to write" in err and "Traceback" not in err, err
    assert _bytes(ws) == before  # source, template, recipe: byte for byte; no output, no report
    assert not (ws / "out.safetensors").exists()
    assert "Successfully applied" not in out  # no summary of a run that did not happen


def test_report_onto_an_existing_target_is_refused_even_with_overwrite(
        ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "plain.yaml")[0] == 0
    before = _bytes(ws)
    for target_spelling in ("out.safetensors", str(ws / "out.safetensors")):
        code, _, err = _run(capsys, "plain.yaml", "--overwrite", "--report", target_spelling)
        assert code == 1 and "two outputs of one run" in err, err
        assert _bytes(ws) == before


def test_existing_report_needs_overwrite(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (ws / "r.json").write_text("keep me")
    code, _, err = _run(capsys, "plain.yaml", "--report", "r.json")
    assert code == 1 and "r.json" in err and "already exists" in err, err
    assert (ws / "r.json").read_text() == "keep me"
    assert not (ws / "out.safetensors").exists()  # refused before the output is written

    code, _, err = _run(capsys, "plain.yaml", "--report", "r.json", "--overwrite")
    assert code == 0, err
    _assert_output_is_source(ws / "out.safetensors")
    doc = json.loads((ws / "r.json").read_text())
    assert doc["status"] == "ok" and doc["written"] is True and doc["errors"] == []
    assert Path(doc["target"]) == ws / "out.safetensors"
    assert sorted(doc["applied"]) == ["b", "w"]
    assert not [p for p in os.listdir(ws) if p.endswith(".tmp")]


def test_report_goes_to_a_new_folder_after_the_output(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "plain.yaml", "--report", "reports/today/r.json")
    assert code == 0, err
    doc = json.loads((ws / "reports" / "today" / "r.json").read_text())
    assert doc["status"] == "ok" and Path(doc["target"]).read_bytes() == (ws / "out.safetensors").read_bytes()
    _assert_output_is_source(ws / "out.safetensors")


# ------------------------------------------------------------------------------------------------
# issue 20 item 7: missing folders, target problems seen by validate/plan, honest reports


def test_missing_target_folders_are_created(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _recipe(ws / "deep.yaml", "a/b/c/out.safetensors")
    code, _, err = _run(capsys, "deep.yaml")
    assert code == 0, err
    _assert_output_is_source(ws / "a" / "b" / "c" / "out.safetensors")
    # convert: the plain copy and the recipe path (any renaming option) both create the folder
    assert main(["convert", "src.safetensors", "x/plain.safetensors", "--no-progress"]) == 0
    _assert_output_is_source(ws / "x" / "plain.safetensors")
    assert main(["convert", "src.safetensors", "y/z/renamed.safetensors", "--remap", "^w$=w", "--no-progress"]) == 0
    _assert_output_is_source(ws / "y" / "z" / "renamed.safetensors")


def _truncate_source_after_the_checks(monkeypatch: pytest.MonkeyPatch, src: Path) -> None:
    """The source loses its tensor bytes after the plan was built and checked: the write fails for
    real (the bytes are not there), as with a file changed under a run."""
    from migrator.run import execute

    check = execute.check_plan_target

    def then_truncate(plan: object) -> None:
        check(plan)  # type: ignore[arg-type]
        os.truncate(src, 16)

    monkeypatch.setattr(execute, "check_plan_target", then_truncate)


def test_failed_write_reports_the_failure_and_leaves_no_folder(
        ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _recipe(ws / "deep.yaml", "new/out.safetensors")
    _truncate_source_after_the_checks(monkeypatch, ws / "src.safetensors")
    code, out, err = _run(capsys, "deep.yaml", "--report", "r.json")
    assert code == 1, (out, err)
    assert "nothing written" in err and "Traceback" not in err
    assert "Successfully applied" not in out  # no summary of a write that failed
    assert not (ws / "new").exists()  # the folder made for the output is removed again
    doc = json.loads((ws / "r.json").read_text())
    assert doc["status"] == "failed" and doc["written"] is False
    last = doc["errors"][-1]
    assert last["kind"] == "run_error" and "src.safetensors" in last["message"]


def test_failed_plan_report_is_not_errors_empty(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_file({"w": W, "other": B}, str(ws / "tpl.safetensors"))  # the template wants a tensor the source lacks
    code, _, err = _run(capsys, "tpl.yaml", "--report", "r.json")
    assert code == 1 and "nothing written" in err, err
    doc = json.loads((ws / "r.json").read_text())
    assert doc["status"] == "failed" and doc["errors"] and not (ws / "out.safetensors").exists()
    assert [m["path"] for m in doc["missing"]] == ["other"]


def test_summary_is_printed_after_the_output_is_published(
        ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from migrator.cli import recipe as run_cli

    seen: list[bool] = []
    outcome = run_cli.print_outcome
    monkeypatch.setattr(run_cli, "print_outcome",
                        lambda *a, **kw: (seen.append((ws / "out.safetensors").exists()), outcome(*a, **kw)))
    assert _run(capsys, "plain.yaml")[0] == 0
    assert seen == [True]


def _validate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["validate", *args])
    out, err = capsys.readouterr()
    return code, out + err


def test_validate_and_plan_report_target_problems(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _validate(capsys, "plain.yaml")[0] == 0
    (ws / "out.safetensors").write_bytes(b"old")
    code, text = _validate(capsys, "plain.yaml")
    assert code == 1 and "already exists" in text and "--overwrite" in text, text
    assert _validate(capsys, "plain.yaml", "--overwrite")[0] == 0
    code = main(["plan", "plain.yaml", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and any("already exists" in e for e in doc["errors"])
    assert main(["plan", "plain.yaml", "--overwrite", "--json"]) == 0
    capsys.readouterr()
    assert (ws / "out.safetensors").read_bytes() == b"old"  # validate and plan write nothing

    (ws / "out.safetensors").unlink()
    (ws / "out.safetensors").mkdir()
    code, text = _validate(capsys, "plain.yaml", "--overwrite")
    assert code == 1 and "is a folder" in text, text
    (ws / "out.safetensors").rmdir()

    (ws / "file").write_text("")
    _recipe(ws / "under.yaml", "file/x/out.safetensors")
    code, text = _validate(capsys, "under.yaml")
    assert code == 1 and "is not a folder" in text, text
    assert main(["plan", "under.yaml"]) == 1
    assert "is not a folder" in capsys.readouterr().err


def _without_dac_override() -> None:
    """As root, chmod does not stop writes: drop the capabilities that bypass permissions from the
    child's bounding set (gone from the exec'd process)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_validate_reports_an_unwritable_folder(ws: Path) -> None:
    (ws / "ro").mkdir()
    _recipe(ws / "ro.yaml", "ro/new/out.safetensors")
    (ws / "ro").chmod(0o555)
    try:
        proc = subprocess.run([sys.executable, "-m", "migrator.cli", "validate", "ro.yaml"], capture_output=True,
                              text=True, cwd=ws, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
                              preexec_fn=_without_dac_override if os.geteuid() == 0 else None)
    except subprocess.SubprocessError as e:  # prctl refused (no CAP_SETPCAP in this container)
        pytest.skip(f"cannot drop CAP_DAC_OVERRIDE for the child: {e}")
    finally:
        (ws / "ro").chmod(0o755)
    assert proc.returncode == 1 and "not writable" in proc.stderr and str(ws / "ro") in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------------------
# issue 19 item 11: scratch names with pids no process can have are someone else's files


@pytest.mark.parametrize("pid", ["99999999999999999999", str(2**63), "4194305", "0", "000123", "1" * 200])
def test_scratch_names_with_impossible_pids_are_left_alone(tmp_path: Path, pid: str) -> None:
    from migrator import from_numpy, save

    target = tmp_path / "out.bpk"
    foreign = tmp_path / f"out.bpk.migrator-{pid}-0.tmp"
    foreign.write_bytes(b"not ours")
    save([from_numpy("w", W)], target)  # crashed with OverflowError from os.kill before
    save([from_numpy("w", W)], target, overwrite=True)
    assert foreign.read_bytes() == b"not ours"
    assert sorted(os.listdir(tmp_path)) == sorted(["out.bpk", foreign.name])


def test_stale_scratch_cleanup_removes_only_files(tmp_path: Path) -> None:
    from migrator import from_numpy, save
    from migrator.storage.atomic import scratch_name

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = tmp_path / "out.bpk"
    stale_file, stale_dir = scratch_name(target, dead.pid, 0), scratch_name(target, dead.pid, 1)
    stale_file.write_bytes(b"x")
    stale_dir.mkdir()
    save([from_numpy("w", W)], target)
    assert not stale_file.exists() and stale_dir.is_dir()


# ------------------------------------------------------------------------------------------------
# issue 19 item 13: permissions follow the sources and the replaced file, as `cp` does


@pytest.fixture
def umask022() -> object:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _cp_mode(src: Path, dst: Path) -> int:
    """The oracle: the mode `cp` gives `dst` (a new file, or the one it overwrites)."""
    subprocess.run(["cp", str(src), str(dst)], check=True)
    return _mode(dst)


@pytest.mark.parametrize("src_mode", [0o600, 0o644, 0o400], ids=oct)
@pytest.mark.parametrize("umask", [0o022, 0o077], ids=oct)
def test_new_output_gets_the_source_mode_masked_by_the_umask(
        ws: Path, capsys: pytest.CaptureFixture[str], src_mode: int, umask: int) -> None:
    src = ws / "src.safetensors"
    src.chmod(src_mode)
    old = os.umask(umask)
    try:
        want = _cp_mode(src, ws / "cp-copy")
        assert main(["convert", "src.safetensors", "plain.bpk", "--no-progress"]) == 0
        assert main(["convert", "src.safetensors", "renamed.bpk", "--remap", "^w$=v", "--no-progress"]) == 0
        assert _run(capsys, "plain.yaml", "--report", "r.json")[0] == 0
    finally:
        os.umask(old)
    got = {p: _mode(ws / p) for p in ("plain.bpk", "renamed.bpk", "out.safetensors", "r.json")}
    assert got == dict.fromkeys(got, want & 0o666)


def test_several_sources_give_the_most_restrictive_mode(ws: Path, capsys: pytest.CaptureFixture[str],
                                                        umask022: object) -> None:
    (ws / "src.safetensors").chmod(0o644)
    (ws / "tpl.safetensors").chmod(0o640)
    assert _run(capsys, "tpl.yaml", "--report", "r.json")[0] == 0
    assert _mode(ws / "out.safetensors") == _mode(ws / "r.json") == 0o640
    (ws / "tpl.safetensors").chmod(0o600)
    assert _run(capsys, "tpl.yaml", "--report", "r2.json", "--overwrite")[0] == 0
    assert _mode(ws / "out.safetensors") == 0o640  # replaced: keeps the mode of the file it replaces
    assert _mode(ws / "r2.json") == 0o600


@pytest.mark.parametrize("old_mode", [0o600, 0o640, 0o664], ids=oct)
def test_overwrite_keeps_the_replaced_file_mode(ws: Path, umask022: object, old_mode: int) -> None:
    src = ws / "src.safetensors"
    src.chmod(0o644)
    for name in ("out.bpk", "cp-copy"):
        (ws / name).write_bytes(b"old")
        (ws / name).chmod(old_mode)
    want = _cp_mode(src, ws / "cp-copy")
    assert want == old_mode
    assert main(["convert", "src.safetensors", "out.bpk", "--overwrite", "--no-progress"]) == 0
    assert _mode(ws / "out.bpk") == want


def test_scratch_file_is_private_while_written(tmp_path: Path, umask022: object) -> None:
    import contextlib

    from migrator import from_numpy, save

    seen: list[int] = []

    @contextlib.contextmanager
    def watch(sink: object, total: int) -> object:
        seen.append(stat.S_IMODE(os.fstat(sink.fileno()).st_mode))  # type: ignore[attr-defined]
        yield

    save([from_numpy("w", W)], tmp_path / "out.bpk", progress=watch)  # type: ignore[arg-type]
    assert seen == [0o600]
    assert _mode(tmp_path / "out.bpk") == 0o644  # no sources: 0666 masked by the umask, as a new file


# ------------------------------------------------------------------------------------------------
# issue 19 item 12: FIFOs and other special files are refused, as sources and as targets


_EACH_COMMAND = """
import contextlib, io, json, sys
from migrator.cli import main
results = []
for args in json.loads(sys.argv[1]):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(args)
    results.append([code, err.getvalue() + out.getvalue()])  # --json puts the error object on stdout
print(json.dumps(results))
"""


def test_fifo_sources_are_refused_without_blocking(ws: Path) -> None:
    """All commands in one child (one interpreter start); its timeout is only a safety net against a
    hang, the asserts are on each command's exit code and error."""
    os.mkfifo(ws / "fifo.safetensors")
    os.mkfifo(ws / "fifo.bpk")
    _recipe(ws / "fifo.yaml", "out.safetensors")
    (ws / "fifo.yaml").write_text((ws / "fifo.yaml").read_text().replace("src.safetensors", "fifo.safetensors"))
    (ws / "fifotpl.yaml").write_text((ws / "tpl.yaml").read_text().replace("tpl.safetensors", "fifo.bpk"))
    commands = [["inspect", "fifo.safetensors"], ["inspect", "fifo.bpk", "--json"],
                ["convert", "fifo.safetensors", "out.bpk"], ["validate", "fifo.yaml"], ["plan", "fifo.yaml"],
                ["run", "fifo.yaml"], ["validate", "fifotpl.yaml"], ["run", "fifotpl.yaml"]]
    proc = subprocess.run([sys.executable, "-c", _EACH_COMMAND, json.dumps(commands)], capture_output=True,
                          text=True, cwd=ws, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    for args, (code, err) in zip(commands, json.loads(proc.stdout), strict=True):
        assert code == 1, (args, err)
        assert "not a regular file (a FIFO)" in err and "Traceback" not in err, (args, err)
    assert not (ws / "out.bpk").exists() and not (ws / "out.safetensors").exists()


def test_folder_without_weights_is_refused(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder is a model folder source; one with no weights file in it is a clear error."""
    (ws / "dir.safetensors").mkdir()
    assert main(["inspect", "dir.safetensors"]) == 1
    err = capsys.readouterr().err
    assert "dir.safetensors: not a model folder" in err and "Traceback" not in err


def _special_targets(ws: Path) -> list[Path]:
    import socket

    os.mkfifo(ws / "fifo.bpk")
    (ws / "null.bpk").symlink_to("/dev/null")
    (ws / "tofifo.bpk").symlink_to("fifo.bpk")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(ws / "sock.bpk"))
    sock.close()
    return [ws / n for n in ("fifo.bpk", "null.bpk", "tofifo.bpk", "sock.bpk")]


def test_overwrite_onto_a_special_file_is_refused(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    specials = _special_targets(ws)
    kinds = {p: stat.S_IFMT(os.lstat(p).st_mode) for p in specials}
    for target in specials:
        assert main(["convert", "src.safetensors", target.name, "--overwrite", "--no-progress"]) == 1
        err = capsys.readouterr().err
        assert "refusing to replace it" in err and target.name in err, err
        code, _, err = _run(capsys, "plain.yaml", "--overwrite", "--report", target.name)
        assert code == 1 and "refusing to replace it" in err, err
    assert {p: stat.S_IFMT(os.lstat(p).st_mode) for p in specials} == kinds  # none replaced
    assert not (ws / "out.safetensors").exists()
    (ws / "special.yaml").write_text((ws / "plain.yaml").read_text().replace("out.safetensors", "fifo.bpk"))
    code, text = _validate(capsys, "special.yaml", "--overwrite")
    assert code == 1 and "is a FIFO" in text, text


# ------------------------------------------------------------------------------------------------
# issue 19 item 14: no writer writes what the format's reference loader cannot read

SHAPES = [(2**64 - 1, 0), (2**63 - 1, 0), (2**63, 0), (0, 2**63 - 1), (2**62, 2, 0), (2**40, 2**40, 0),
          (0, 2**40, 2**40), (2**32, 2**31, 0), (2**32, 2**32, 0), (0, 2**62, 2), (0, 2**63 - 1, 1), (2**64, 0)]


def _empty(shape: tuple[int, ...]) -> object:
    from migrator.core import dtypes
    from migrator.core.tensor import LazyTensor

    return LazyTensor("enc.w", dtypes.F32, shape, 0, lambda: b"")


def _torch_load(data: bytes) -> tuple[int, ...]:
    import io

    import torch

    return tuple(torch.load(io.BytesIO(data), weights_only=True)["enc.w"].shape)


def _safetensors_shape(data: bytes, tmp_path: Path) -> tuple[int, ...]:
    from safetensors import safe_open

    path = tmp_path / "probe.safetensors"
    path.write_bytes(data)
    with safe_open(str(path), framework="numpy") as f:
        return tuple(f.get_slice("enc.w").get_shape())


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fmt", ["pytorch", "safetensors"])
def test_writers_write_only_what_the_reference_loader_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            fmt: str, shape: tuple[int, ...]) -> None:
    from migrator import to_bytes
    from migrator.core.errors import PlanError
    from migrator.formats import pytorch_writer, safetensors

    def load(data: bytes) -> tuple[int, ...]:
        return _torch_load(data) if fmt == "pytorch" else _safetensors_shape(data, tmp_path)

    try:
        data = to_bytes([_empty(shape)], fmt)  # type: ignore[list-item]
    except PlanError as e:
        assert e.tensor == "enc.w" and str(list(shape)) in str(e), e
        # the refusal is right: the same file written without the check is one the loader refuses
        monkeypatch.setattr(pytorch_writer, "_check_torch_sizes", lambda t: None)
        monkeypatch.setattr(safetensors, "check_u64_sizes", lambda ts, why: None)
        try:
            unchecked = to_bytes([_empty(shape)], fmt)  # type: ignore[list-item]
        except PlanError:
            return  # refused by an older check too (e.g. a size beyond 64 bits): nothing to load
        with pytest.raises(Exception):  # noqa: B017 - whatever the loader raises, it does not load
            load(unchecked)
        return
    assert load(data) == shape


@pytest.mark.parametrize("shape", [(2**40, 2**40, 0), (2**32, 2**32, 0), (2**64, 0)], ids=str)
def test_burnpack_writer_refuses_sizes_beyond_64_bits(shape: tuple[int, ...]) -> None:
    from migrator import to_bytes
    from migrator.core.errors import PlanError

    with pytest.raises(PlanError, match="64-bit") as info:
        to_bytes([_empty(shape)], "burnpack")  # type: ignore[list-item]
    assert info.value.tensor == "enc.w"


def test_convert_refuses_a_pt_output_torch_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from migrator import to_bytes

    src = tmp_path / "huge-empty.safetensors"
    src.write_bytes(to_bytes([_empty((2**64 - 1, 0))], "safetensors"))  # type: ignore[list-item]
    assert _safetensors_shape(src.read_bytes(), tmp_path) == (2**64 - 1, 0)  # a valid SafeTensors file
    assert main(["convert", str(src), str(tmp_path / "out.pt"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "tensor 'enc.w'" in err and "int64" in err, err
    assert not (tmp_path / "out.pt").exists()


def test_schema_output_file_goes_through_the_atomic_path(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    printed = capsys.readouterr().out
    assert main(["schema", "-o", "schemas/recipe.schema.json"]) == 0
    assert (ws / "schemas" / "recipe.schema.json").read_text() == printed
    json.loads(printed)
    (ws / "schemas" / "recipe.schema.json").write_text("keep")
    assert main(["schema", "-o", "schemas/recipe.schema.json"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert (ws / "schemas" / "recipe.schema.json").read_text() == "keep"
    os.mkfifo(ws / "fifo.json")
    assert main(["schema", "-o", "fifo.json", "--overwrite"]) == 1
    assert "FIFO" in capsys.readouterr().err and stat.S_ISFIFO(os.lstat(ws / "fifo.json").st_mode)
    assert main(["schema", "-o", "schemas/recipe.schema.json", "--overwrite"]) == 0
    assert (ws / "schemas" / "recipe.schema.json").read_text() == printed


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "dotted"])
def test_output_onto_the_source_is_refused_with_overwrite(ws: Path, capsys: pytest.CaptureFixture[str],
                                                          how: str) -> None:
    target = {"same": "src.safetensors", "symlink": "l.safetensors", "hardlink": "h.safetensors",
              "dotted": "./x/../src.safetensors"}[how]
    if how == "symlink":
        (ws / target).symlink_to("src.safetensors")
    elif how == "hardlink":
        os.link(ws / "src.safetensors", ws / target)
    elif how == "dotted":
        (ws / "x").mkdir()
    (ws / "onto.yaml").write_text((ws / "plain.yaml").read_text().replace("out.safetensors", target))
    before = _bytes(ws)
    assert main(["convert", "src.safetensors", target, "--overwrite", "--no-progress"]) == 1
    assert "refusing to write onto a file being read" in capsys.readouterr().err
    code, _, err = _run(capsys, "onto.yaml", "--overwrite")  # the recipe loader sees it first
    assert code == 2 and "onto.yaml:5:9: target.path: the target is the same file as source.path" in err, err
    assert _bytes(ws) == before
    _assert_output_is_source(ws / "src.safetensors")


def test_python_save_takes_the_mode_of_the_files_the_tensors_came_from(ws: Path, umask022: object) -> None:
    from migrator import from_numpy, open_file, save

    (ws / "src.safetensors").chmod(0o600)
    want = _cp_mode(ws / "src.safetensors", ws / "cp-copy")
    with open_file(ws / "src.safetensors") as r:
        save(r.tensors, ws / "stored.bpk")
        save([t.renamed(t.name + "2") for t in r.tensors] + [from_numpy("extra", W)], ws / "mixed.bpk")
    assert _mode(ws / "stored.bpk") == _mode(ws / "mixed.bpk") == want == 0o600

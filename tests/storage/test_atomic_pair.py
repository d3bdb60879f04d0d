"""`storage.atomic_pair.atomic_outputs`: files written whole, then renamed in order; an error publishes none.

Oracles: the bytes the test wrote before (the old files) and the folder's listing.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from migrator.core.errors import OutputError, SameFileError, TargetExistsError
from migrator.storage import atomic_pair
from migrator.storage.atomic_pair import atomic_outputs


def listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_both_are_published_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    real = atomic_pair._publish

    def spy(scratch: Path, target: Path, **kw: Any) -> None:
        order.append(target.name)
        real(scratch, target, **kw)

    monkeypatch.setattr(atomic_pair, "_publish", spy)
    with atomic_outputs([tmp_path / "r.bpk", tmp_path / "m.bpk"], expected_sizes=[1, 2]) as (r, m):
        r.write(b"r")
        m.write(b"mm")
    assert order == ["r.bpk", "m.bpk"]
    assert listing(tmp_path) == {"m.bpk": b"mm", "r.bpk": b"r"}


def test_a_failed_second_rename_puts_the_first_file_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "r.bpk").write_bytes(b"old record")
    (tmp_path / "m.bpk").write_bytes(b"old model")
    real = atomic_pair._publish

    def second_fails(scratch: Path, target: Path, **kw: Any) -> None:
        if target.name == "m.bpk":
            raise OSError(errno.EIO, "Input/output error")
        real(scratch, target, **kw)

    monkeypatch.setattr(atomic_pair, "_publish", second_fails)
    with pytest.raises(OutputError, match="Input/output error"), \
            atomic_outputs([tmp_path / "r.bpk", tmp_path / "m.bpk"], overwrite=True) as (r, m):
        r.write(b"new record")
        m.write(b"new model")
    assert listing(tmp_path) == {"m.bpk": b"old model", "r.bpk": b"old record"}  # no scratch, no aside


def test_a_failed_second_rename_removes_a_first_file_that_was_new(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    real = atomic_pair._publish

    def second_fails(scratch: Path, target: Path, **kw: Any) -> None:
        if target.name == "m.bpk":
            raise OSError(errno.EIO, "Input/output error")
        real(scratch, target, **kw)

    monkeypatch.setattr(atomic_pair, "_publish", second_fails)
    with pytest.raises(OutputError), atomic_outputs([tmp_path / "r.bpk", tmp_path / "m.bpk"]) as (r, m):
        r.write(b"r")
        m.write(b"m")
    assert listing(tmp_path) == {}


def test_a_target_that_appears_meanwhile_stops_both_before_any_rename(tmp_path: Path) -> None:
    with pytest.raises(TargetExistsError), atomic_outputs([tmp_path / "r.bpk", tmp_path / "m.bpk"]) as (r, m):
        r.write(b"r")
        m.write(b"m")
        (tmp_path / "m.bpk").write_bytes(b"someone else's")
    assert listing(tmp_path) == {"m.bpk": b"someone else's"}


def test_one_target_twice_or_a_protected_file_is_refused_up_front(tmp_path: Path) -> None:
    with pytest.raises(SameFileError), atomic_outputs([tmp_path / "a.bpk", tmp_path / "a.bpk"]):
        pytest.fail("the body ran")
    (tmp_path / "src.pt").write_bytes(b"source")
    os.link(tmp_path / "src.pt", tmp_path / "r.bpk")
    with pytest.raises(SameFileError), atomic_outputs([tmp_path / "r.bpk", tmp_path / "m.bpk"], overwrite=True,
                                                      protect=[tmp_path / "src.pt"]):
        pytest.fail("the body ran")
    assert sorted(listing(tmp_path)) == ["r.bpk", "src.pt"]


def test_an_error_in_the_body_publishes_neither(tmp_path: Path) -> None:
    (tmp_path / "m.bpk").write_bytes(b"old")
    pair = [tmp_path / "r.bpk", tmp_path / "m.bpk"]
    with pytest.raises(RuntimeError), atomic_outputs(pair, overwrite=True) as (r, _):
        r.write(b"r")
        raise RuntimeError("full disk, say")
    assert listing(tmp_path) == {"m.bpk": b"old"}


@pytest.mark.parametrize("pair", [False, True])
def test_a_folder_removed_by_another_jobs_failure_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                pair: bool) -> None:
    """Two jobs make `out/`; one fails and removes the empty folders it made, between this write
    finding `out/` there and creating its scratch file in it (played here, without timing, by the
    scratch clean-up that runs just then). The folder is made again and the file written."""
    from migrator.storage import atomic

    real = atomic.clean_stale_scratch
    removed: list[Path] = []

    def other_job_fails(target: Path) -> list[Path]:
        if not removed:
            os.rmdir(target.parent)  # the other job's _remove_folders: out/ is still empty
            removed.append(target.parent)
        return real(target)

    monkeypatch.setattr(atomic, "clean_stale_scratch", other_job_fails)
    monkeypatch.setattr(atomic_pair, "clean_stale_scratch", other_job_fails)
    (tmp_path / "out").mkdir()  # as the other job made it
    if pair:
        with atomic_outputs([tmp_path / "out" / "r.bpk", tmp_path / "out" / "m.bpk"], make_folders=True) as (r, m):
            r.write(b"r")
            m.write(b"m")
        assert listing(tmp_path / "out") == {"m.bpk": b"m", "r.bpk": b"r"}
    else:
        atomic.write_file(tmp_path / "out" / "a.json", b"{}", make_folders=True)
        assert listing(tmp_path / "out") == {"a.json": b"{}"}
    assert removed == [tmp_path / "out"]

"""`storage.atomic.same_file`, the one rule of every "is this output one of the inputs?" check:
the filesystem's own answer (an inode, a resolved path) is the oracle."""

from __future__ import annotations

import os
from pathlib import Path

from migrator.storage.atomic import same_file


def test_existing_files_are_compared_by_inode(tmp_path: Path) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"x")
    b.write_bytes(b"x")  # equal bytes, another file
    os.link(a, tmp_path / "hard.bin")
    (tmp_path / "soft.bin").symlink_to(a)
    assert same_file(a, tmp_path / "hard.bin") and os.path.samefile(a, tmp_path / "hard.bin")
    assert same_file(a, tmp_path / "soft.bin") and same_file(str(tmp_path / "soft.bin"), str(a))
    assert not same_file(a, b)


def test_a_missing_file_is_compared_by_its_resolved_path(tmp_path: Path) -> None:
    """A target not written yet is the file a path resolves to: both former copies of this rule
    disagreed here (one said "not the same" whenever a file was missing)."""
    (tmp_path / "sub").mkdir()
    missing = tmp_path / "out.bpk"
    assert same_file(missing, tmp_path / "sub" / ".." / "out.bpk")
    (tmp_path / "link").symlink_to(tmp_path / "sub")
    assert same_file(tmp_path / "sub" / "new.bpk", tmp_path / "link" / "new.bpk")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere.bpk")
    assert same_file(tmp_path / "dangling", tmp_path / "nowhere.bpk")
    assert not same_file(missing, tmp_path / "other.bpk")
    existing = tmp_path / "in.bpk"
    existing.write_bytes(b"x")
    assert not same_file(existing, missing) and not same_file(missing, existing)
    assert not same_file(tmp_path / "a\0b", existing)  # an impossible path is no file of ours

"""What a pattern and a chain of remap rules may cost (issue 41, class 6): bounded by the pattern and
by the name, never by how many matches a name has, how many groups a pattern has or how often rules
double a name. Each case runs under SIGALRM (a hang fails, nothing is timed); the renamed names are
compared with Python's `re.sub` (the oracle for what a remap of a plain pattern makes)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from migrator.core.limits import DEFAULT_LIMITS
from migrator.naming import KeyRemapper, NamingError, compile_regex
from migrator.naming.regex import MAX_CAPTURES, MAX_GROUPS, MAX_PATTERN_CHARS
from migrator.naming.remap import MAX_NAME_GROWTH, NameTooLongError
from tests.support.alarm import alarm
from tests.support.cli import migrate_in_process
from tests.support.hostile import refused


def test_a_long_non_ascii_name_with_a_match_per_character_is_linear() -> None:
    """60,000 matches in a 60,000-character non-ASCII name: offsets are mapped once per name (a map
    rebuilt per match took 60,000 x 60,000 steps)."""
    name = "é." * 30_000
    with alarm(20, "a remap of a long non-ASCII name ran past 20 s"):
        out = KeyRemapper([("é", "e")]).remap_name(name)
    assert out == re.sub("é", "e", name)


@pytest.mark.parametrize("pattern, words", [
    ("(a?)" * 1_100, "characters"),  # 4,400 characters
    ("(?:a?)" * 300, "groups"),
    ("(a?)" * (MAX_CAPTURES + 1), "capturing groups"),
    ("(" * 300 + "a" + ")" * 300, "groups"),
    ("(x|" + "(a)?" * 100 + ")+", "capturing groups"),
])
def test_patterns_beyond_the_bounds_are_refused_before_compiling(pattern: str, words: str) -> None:
    with pytest.raises(NamingError, match=words) as e:
        compile_regex(pattern)
    assert len(str(e.value)) < 400


def test_the_bounds_admit_a_pattern_at_them() -> None:
    assert MAX_GROUPS >= MAX_CAPTURES
    r = compile_regex("(a?)" * MAX_CAPTURES)
    assert r.groups == MAX_CAPTURES and len("(a?)" * MAX_CAPTURES) <= MAX_PATTERN_CHARS


def test_the_costliest_admitted_pattern_on_the_longest_admitted_name_takes_seconds() -> None:
    """64 capturing groups under a repetition, on a name of `max_name_chars`: RE2 tracks every group
    per character; bounded both ways, this is a fraction of a second, never minutes."""
    pattern = "(x|" + "(a?)" * (MAX_CAPTURES - 2) + "(b))+"
    name = "ab" * (DEFAULT_LIMITS.max_name_chars // 2)
    with alarm(20, "the costliest admitted match ran past 20 s"):
        out = KeyRemapper([(pattern, "y")]).remap_name(name)
    assert out == re.sub(pattern, "y", name)


def test_chained_doubling_rules_stop_at_the_growth_cap() -> None:
    rules = KeyRemapper([("^(.*)$", "$1$1")] * 40)
    with alarm(20, "doubling rules ran past 20 s"), pytest.raises(NameTooLongError, match="65,5"):
        rules.remap_name("x" * 100)
    assert KeyRemapper([("^(.*)$", "$1$1")] * 3).remap_name("ab") == "ab" * 8  # as re.sub would make it


def test_one_replacement_of_many_references_stops_while_expanding() -> None:
    """1,000 references to a 10,000-character group would be 10 million characters in one expansion."""
    rule = KeyRemapper([("^(.+)$", "$1" * 1000)])
    with pytest.raises(NameTooLongError):
        rule.remap_name("y" * 10_000)
    assert len(KeyRemapper([("^(.+)$", "$1" * 6)]).remap_name("y" * 10_000)) == 60_000 <= 10_000 + MAX_NAME_GROWTH


def test_doubling_remaps_on_the_command_line_are_one_line(tmp_path: Path) -> None:
    save_file({"w": np.zeros(2, np.float32)}, str(tmp_path / "m.safetensors"))
    target = tmp_path / "o.safetensors"
    remaps = [x for _ in range(30) for x in ("--remap", "^(.*)$=$1$1")]
    refused(["convert", str(tmp_path / "m.safetensors"), str(target), *remaps], tmp_path, words="characters")


def test_a_name_over_the_default_cap_is_refused_and_the_cap_can_be_lifted(tmp_path: Path) -> None:
    name = "a." * (DEFAULT_LIMITS.max_name_chars // 2) + "w"
    save_file({name: np.zeros(2, np.float32)}, str(tmp_path / "m.safetensors"))
    target = tmp_path / "o.safetensors"
    refused(["convert", str(tmp_path / "m.safetensors"), str(target), "--include", "w$"], tmp_path,
            words="max_name_chars")
    done = migrate_in_process("convert", str(tmp_path / "m.safetensors"), str(target), "--include", "w$",
                              "--limit", "max_name_chars=0")
    assert done.returncode == 0, done.stderr


def test_a_pattern_of_many_groups_on_the_command_line_is_one_line(tmp_path: Path) -> None:
    save_file({"w": np.zeros(2, np.float32)}, str(tmp_path / "m.safetensors"))
    refused(["convert", str(tmp_path / "m.safetensors"), str(tmp_path / "o.safetensors"), "--include",
             "(a?)" * 1000], tmp_path, words="groups")


def test_a_non_utf8_remap_is_one_line(tmp_path: Path) -> None:
    """A `--remap` of bytes that are not UTF-8 (as a shell passes them: surrogate escapes)."""
    save_file({"w": np.zeros(2, np.float32)}, str(tmp_path / "m.safetensors"))
    bad = b"w\xff=v".decode("utf-8", "surrogateescape")
    done = migrate_in_process("convert", str(tmp_path / "m.safetensors"), str(tmp_path / "o.safetensors"),
                              "--remap", bad)
    # a usage error: argparse's usage, then the one error line (as for any bad --remap)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "not UTF-8" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "o.safetensors").exists()

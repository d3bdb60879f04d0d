"""Issue 20 item 3: a replacement that refers to a capture group the pattern does not have.

Burn expands such a reference to '' (so `to: 'layers.$2.'` with one group names every layer
`layers..weight`); migrator reported that as a collision when planning. Now it is refused where it
is written: at the `to:` LINE:COL when the recipe loads, and as a usage error (exit 2) of `migrate
convert --remap`. The oracle for which groups exist is Python's `re` itself.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, save
from migrator.naming import NamingError, RemapRule
from migrator.naming.remap import _parse_python_template
from migrator.recipe.loader import RecipeError, load_recipe

CASES = [  # (from, to, what the message says)
    (r"^(\d+)\.", "layers.$2.", "$2: group 2 does not exist; the pattern has 1 group"),
    (r"^(\d+)\.", "layers.${name}.", "$name: group 'name' does not exist; the pattern has 1 group"),
    (r"^(\d+)\.", r"layers.\2.", r"\2: group 2 does not exist; the pattern has 1 group"),
    (r"^(?P<i>\d+)\.", r"layers.\g<name>.", r"\g<name>: group 'name' does not exist; the pattern has 1 group "
                                            "(named: i)"),
    (r"^(?P<i>\d+)\.", r"layers.\g<3>.", r"\g<3>: group 3 does not exist; the pattern has 1 group (named: i)"),
    (r"^\d+\.", "layers.$1.", "$1: group 1 does not exist; the pattern has 0 groups"),
    (r"^(\d+)\.(\w+)", "$3.$1", "$3: group 3 does not exist; the pattern has 2 groups"),
]


@pytest.mark.parametrize(("pattern", "to", "says"), CASES)
def test_recipe_error_at_the_line_of_to(tmp_path: Path, pattern: str, to: str, says: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("version: 1\nsource: {path: a.safetensors}\ntarget: {path: b.safetensors}\nremap:\n"
                    f"  - from: '{pattern}'\n    to: '{to}'\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert str(e.value) == f"{path}:6:9: remap[0].to: {says}"


@pytest.mark.parametrize(("pattern", "to", "says"), CASES)
def test_convert_remap_is_a_usage_error(tmp_path: Path, pattern: str, to: str, says: str) -> None:
    from migrator.cli import main

    src = tmp_path / "a.safetensors"
    save([from_numpy("0.w", np.zeros(2, np.float32)), from_numpy("1.w", np.ones(2, np.float32))], src)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        main(["convert", str(src), str(tmp_path / "b.safetensors"), "--remap", f"{pattern}={to}"])
    assert e.value.code == 2 and not (tmp_path / "b.safetensors").exists()
    assert f"--remap '{pattern}={to}': {says}" in err.getvalue()


def test_references_to_groups_that_exist_still_work(tmp_path: Path) -> None:
    for pattern, to in [(r"^(\d+)\.", "layers.$1."), (r"^(?P<i>\d+)\.", "layers.${i}."), (r"^(\d+)\.", r"l.\1."),
                        (r"^(?P<i>\d+)\.", r"l.\g<i>."), (r"^(\d+)\.", "cost$$1."), (r"^(\d+)\.", "l${1}_x.")]:
        rule = RemapRule(pattern, to)
        assert rule.missing_group_problem() is None
        assert rule.apply("3.w") == re.sub(r"^(\d+)\.", {"layers.$1.": "layers.3.", "layers.${i}.": "layers.3.",
                                                       r"l.\1.": "l.3.", r"l.\g<i>.": "l.3.",
                                                       "cost$$1.": "cost$1.", "l${1}_x.": "l3_x."}[to], "3.w")


@pytest.mark.parametrize("template", [r"\1", r"\12", r"\g<1>", r"\g<x>", r"\0", r"\101", r"\\1", r"a\n\1",
                                      r"\g<1>\2", r"\1\\\2"])
def test_python_refs_are_what_re_resolves(template: str) -> None:
    """`re` itself is the oracle: a template compiles against a pattern with enough groups iff every ref
    found exists."""
    refs = [p if isinstance(p, int) else str(p) for p in _parse_python_template(template, "p")
            if isinstance(p, int) or type(p) is not str]
    wide = re.compile("(?P<x>a)" + "(a)" * 11)
    wide.sub(template, "")  # every ref exists here
    for groups in range(0, 3):
        narrow = re.compile("(a)" * groups)
        ok = all(isinstance(r, int) and r <= groups for r in refs)
        try:
            narrow.sub(template, "")
            compiled = True
        except (re.error, IndexError):
            compiled = False
        assert compiled == ok, (template, groups, refs)


@pytest.mark.parametrize("template", [r"\1", r"\12", r"\g<1>", r"\g<x>", r"\0", r"\101", r"\\1", r"a\n\1",
                                      r"\g<1>\2", r"\1\\\2", r"\t\a\b\f\v\r", r"\.\-\1", r"\07x", r"\g<12>é"])
def test_python_templates_expand_as_re_expands_them(template: str) -> None:
    """`re.sub` is the oracle of what a Python-syntax template writes (the rule runs on RE2)."""
    pattern = "(?P<x>a)" + "(b)" * 11
    text = "za" + "b" * 11 + "z"
    assert RemapRule(pattern, template, "python").apply(text) == re.sub(pattern, template, text)


@pytest.mark.parametrize("template", [r"\q", r"\g<1", r"\g<>", r"\g<-1>", "a\\", r"\477"])
def test_python_templates_re_refuses_are_refused(template: str) -> None:
    with pytest.raises(re.error):
        re.sub("(a)", template, "a")
    with pytest.raises(NamingError, match="Python replacement"):
        RemapRule("(a)", template, "python")


def test_python_syntax_error_is_a_naming_error_with_the_count() -> None:
    with pytest.raises(NamingError) as e:
        RemapRule(r"(a)(b)", r"\3", "python")
    assert e.value.message == r"\3: group 3 does not exist; the pattern has 2 groups"

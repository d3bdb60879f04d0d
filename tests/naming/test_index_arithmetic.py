"""Index arithmetic in replacements (`${1+12}`, `${1-12}`): migrator's extension to Burn's syntax."""

from __future__ import annotations

import re

import pytest

from migrator.naming import IndexArithmeticError, NamingError, RemapRule, expand_replacement


@pytest.mark.parametrize(("name", "to", "want"), [
    ("encoder.layer.13.w", "layer.${1-12}.", "encoder.layer.1.w"),
    ("encoder.layer.0.w", "layer.${1+6}.", "encoder.layer.6.w"),
    ("encoder.layer.07.w", "layer.${1+1}.", "encoder.layer.08.w"),  # leading zeros keep the width
    ("encoder.layer.09.w", "layer.${1+1}.", "encoder.layer.10.w"),
    ("encoder.layer.99.w", "layer.${1+1}.", "encoder.layer.100.w"),
    ("encoder.layer.10.w", "layer.${1-3}.", "encoder.layer.7.w"),
    ("encoder.layer.12.w", "layer.$1+1.", "encoder.layer.12+1.w"),  # unbraced: group 1, then text, as in Rust
    ("encoder.layer.5.w", "layer.$${1+1}.", "encoder.layer.${1+1}.w"),  # $$ is a literal dollar
])
def test_offsets(name: str, to: str, want: str) -> None:
    assert RemapRule(r"layer\.(\d+)\.", to).apply(name) == want


def test_named_group_and_every_match() -> None:
    rule = RemapRule(r"h\.(?<n>\d+)", "h.${n+10}")
    assert rule.apply("h.1.x.h.2") == "h.11.x.h.12"


@pytest.mark.parametrize(("name", "message"), [
    ("layer.3.w", "${1-12} on tensor 'layer.3.w' gives -9 (group 1 is '3'): an index cannot be negative"),
    ("layer.x.w", "${1-12} on tensor 'layer.x.w': group 1 is 'x', not a number"),
    ("layer.٣.w", "${1-12} on tensor 'layer.٣.w': group 1 is '٣', not a number"),  # a non-ASCII digit
])
def test_bad_results_name_the_tensor(name: str, message: str) -> None:
    with pytest.raises(IndexArithmeticError) as e:
        RemapRule(r"layer\.(\w+)\.", "layer.${1-12}.").apply(name)
    assert str(e.value) == message


def test_missing_group_is_shown_as_written() -> None:
    assert RemapRule(r"layer\.(\d+)", "layer.${2+1}").missing_group_problem() == (
        "${2+1}: group 2 does not exist; the pattern has 1 group", None)


def test_expand_replacement_for_other_callers() -> None:
    m = re.search(r"blocks\.(\d+)\.", "blocks.4.attn")
    assert m is not None
    assert expand_replacement(m, "layers.${1+8}.") == "layers.12."
    with pytest.raises(NamingError, match=r"\$\{3-1\}: group 3 does not exist"):
        expand_replacement(m, "${3-1}")

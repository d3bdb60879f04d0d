"""Jaro (textdistance-crate variant) and "did you mean", as Burn suggests."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from migrator.naming.similarity import did_you_mean, jaro

JARO_VECTORS = [
    ("test", "tset", 0.916667),
    ("dixon", "dicksonx", 0.766667),
    ("a", "ab", 0.833333),
    ("dwayne", "duane", 0.822222),
    ("Friedrich Nietzsche", "Jean-Paul Sartre", 0.391886),
    ("encoder.layer1.weight", "encoder.layer_1.weight", 0.984848),
    ("fc.weight", "fc1.weight", 0.966667),
    ("norm.gamma", "norm.weight", 0.715152),
    ("linear.bias", "decoder.bias", 0.739899),
    ("conv.weight", "classifier.weight", 0.649287),
    ("ab", "ba", 0.0),
    ("aaaabb", "aabbaa", 0.944444),  # textbook Jaro: 0.888889
]


@pytest.mark.parametrize(("a", "b", "expected"), JARO_VECTORS)
def test_jaro_vectors(a: str, b: str, expected: float) -> None:
    assert jaro(a, b) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("", "", 1.0),
        ("", "a", 0.0),
        ("a", "", 0.0),
        ("a", "a", 1.0),
        ("a", "b", 0.0),
        ("abc", "abc", 1.0),
        ("abc", "xyz", 0.0),
    ],
)
def test_jaro_edges(a: str, b: str, expected: float) -> None:
    assert jaro(a, b) == expected


def test_jaro_counts_code_points() -> None:
    assert jaro("é", "é") == 1.0
    assert jaro("😀a", "😀b") == pytest.approx(jaro("xa", "xb"))


@given(st.text(max_size=12), st.text(max_size=12))
def test_property_jaro_range_and_identity(a: str, b: str) -> None:
    score = jaro(a, b)
    assert 0.0 <= score <= 1.0
    assert jaro(a, a) == 1.0


@pytest.mark.parametrize(
    ("missing", "unused", "expected"),
    [
        ("fc.weight", ["fc1.weight"], "fc1.weight"),
        ("norm.gamma", ["norm.weight"], "norm.weight"),
        ("conv.weight", ["classifier.weight"], None),  # 0.649 < 0.7
        ("linear.bias", ["decoder.bias"], "decoder.bias"),
        ("feature.BaseConv.weight", ["feature.weight"], "feature.weight"),
        ("x", [], None),
        ("encoder.layer1.weight", ["zzz", "encoder.layer_1.weight", "encoder.layer1.bias"], "encoder.layer_1.weight"),
    ],
)
def test_did_you_mean(missing: str, unused: list[str], expected: str | None) -> None:
    assert did_you_mean(missing, unused) == expected


def test_enum_strip_beats_a_closer_jaro_match() -> None:
    unused = ["feature.BaseConv.weigh", "feature.weight"]
    assert jaro("feature.BaseConv.weight", "feature.BaseConv.weigh") > jaro("feature.BaseConv.weight", "feature.weight")
    assert did_you_mean("feature.BaseConv.weight", unused) == "feature.weight"


def test_enum_strip_falls_back_to_jaro() -> None:
    # 'feature.weight' is not unused, so Jaro decides.
    assert did_you_mean("feature.BaseConv.weight", ["feature.BaseConv.weights"]) == "feature.BaseConv.weights"


def test_ties_go_to_the_alphabetically_first() -> None:
    # Both candidates score the same; order given must not matter.
    a, b = "fc.weighx", "fc.weighy"
    assert jaro("fc.weight", a) == jaro("fc.weight", b)
    assert did_you_mean("fc.weight", [b, a]) == a
    assert did_you_mean("fc.weight", [a, b]) == a


def test_best_score_wins_over_alphabetical_order() -> None:
    assert did_you_mean("fc.weight", ["fc.weights_old", "fc1.weight", "fc.weight_"]) == "fc.weight_"


def test_threshold_is_inclusive() -> None:
    # l1 = l2 = 20, m = 11, t = 0 -> (0.55 + 0.55 + 1) / 3 = 0.7: kept (>= 0.7).
    a = "abcdefghijk" + "123456789"
    b = "abcdefghijk" + "QRSTUVWXY"
    assert jaro(a, b) == pytest.approx(0.7)
    assert jaro(a, b) >= 0.7
    assert did_you_mean(a, [b]) == b


@given(st.text(alphabet="ab.c1", max_size=8), st.lists(st.text(alphabet="ab.c1", max_size=8), max_size=8))
def test_property_did_you_mean_matches_reference(missing: str, unused: list[str]) -> None:
    # The pruned search must agree with the spec's sort-then-filter formulation.
    from migrator.naming import strip_enum_variant

    stripped = strip_enum_variant(missing)
    if stripped is not None and stripped in unused:
        expected: str | None = stripped
    else:
        scored = sorted(((c, jaro(missing, c)) for c in sorted(unused)), key=lambda cs: -cs[1])
        kept = [c for c, s in scored if s >= 0.7]
        expected = kept[0] if kept else None
    assert did_you_mean(missing, unused) == expected


def _spec_jaro(s1: str, s2: str) -> float:
    """Jaro as the textdistance crate computes it, written plainly (slow, obviously right)."""
    l1, l2 = len(s1), len(s2)
    if l1 == 0 or l2 == 0:
        return 1.0 if l1 == 0 and l2 == 0 else 0.0
    if l1 == 1 and l2 == 1:
        return 1.0 if s1 == s2 else 0.0
    window = max(l1, l2) // 2 - 1
    m = t = last_j = 0
    used2 = [False] * l2
    for i, a in enumerate(s1):
        lo = i - window if i > window else 0
        hi = min(l2 - 1, i + window)
        if lo > hi:
            continue
        for j in range(l2):
            if lo <= j <= hi and a == s2[j] and not used2[j]:
                used2[j] = True
                m += 1
                if j < last_j:
                    t += 1
                last_j = j
                break
    return 0.0 if m == 0 else (m / l1 + m / l2 + (m - t) / m) / 3


@given(st.text(alphabet="ab.1é😀", max_size=16), st.text(alphabet="ab.1é😀", max_size=16))
def test_property_jaro_equals_spec_pseudo_code(a: str, b: str) -> None:
    assert jaro(a, b) == _spec_jaro(a, b)


@pytest.mark.parametrize(("a", "b", "expected"), JARO_VECTORS)
def test_spec_transcription_agrees_with_vectors(a: str, b: str, expected: float) -> None:
    assert _spec_jaro(a, b) == pytest.approx(expected, abs=1e-6)

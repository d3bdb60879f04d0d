"""Name transforms: KeyRemapper, contiguous indices, enum strip, filter regexes (Burn's rules)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from migrator.naming import (
    KeyRemapper,
    NamingError,
    RemapRule,
    compile_regex,
    contiguous_names,
    find_collisions,
    parse_usize,
    strip_enum_variant,
)

# ---------------------------------------------------------------------------------------------
# KeyRemapper: Burn's documented examples
# ---------------------------------------------------------------------------------------------


def test_remap_basic_prefix() -> None:
    remapper = KeyRemapper().add_pattern(r"^encoder\.", "transformer.encoder.")
    assert remapper.remap(["encoder.layer1.weight", "decoder.layer1.weight"]) == [
        ("transformer.encoder.layer1.weight", "encoder.layer1.weight"),
        ("decoder.layer1.weight", "decoder.layer1.weight"),
    ]


def test_remap_two_chained_patterns() -> None:
    remapper = KeyRemapper().add_pattern(r"^encoder\.", "transformer.encoder.").add_pattern(r"\.gamma$", ".weight")
    assert remapper.remap_name("encoder.layer1.gamma") == "transformer.encoder.layer1.weight"
    assert remapper.remap_name("decoder.layer1.gamma") == "decoder.layer1.weight"
    assert remapper.remap_name("encoder.gamma_x") == "transformer.encoder.gamma_x"


def test_remap_three_pattern_pytorch_chain() -> None:
    remapper = KeyRemapper(
        [
            (r"(.+)\.block\.0\.(.+)", "$1.conv.$2"),
            (r"(.+)\.block\.1\.(.+)", "$1.bn.$2"),
            (r"layer\.([0-9])\.(.+)", "layer.blocks.$1.$2"),
        ]
    )
    assert len(remapper) == 3
    assert remapper.remap(["layer.0.block.1.running_mean", "layer.2.block.0.weight"]) == [
        ("layer.blocks.0.bn.running_mean", "layer.0.block.1.running_mean"),
        ("layer.blocks.2.conv.weight", "layer.2.block.0.weight"),
    ]


def test_chaining_each_pattern_sees_previous_output() -> None:
    remapper = KeyRemapper([("a", "b"), ("b", "c")])
    assert remapper.remap_name("a") == "c"  # not first-match-wins


def test_empty_remapper_returns_identity_pairs() -> None:
    remapper = KeyRemapper()
    assert len(remapper) == 0
    assert remapper.remap(["x.weight", "y"]) == [("x.weight", "x.weight"), ("y", "y")]


def test_replaces_all_non_overlapping_matches() -> None:
    assert RemapRule(r"aa", "b").apply("aaaaa") == "bba"
    assert RemapRule(r"\.", "/").apply("a.b.c") == "a/b/c"


def test_unanchored_search() -> None:
    assert RemapRule("layer", "blk").apply("enc.layer.w") == "enc.blk.w"


def test_empty_matches_follow_rust_iteration() -> None:
    # Python's re.sub gives '-a-b--d-' (an empty match right after 'x'); Rust skips that one.
    assert re.sub("x*", "-", "abxd") == "-a-b--d-"
    assert RemapRule("x*", "-").apply("abxd") == "-a-b-d-"
    assert RemapRule("", "-").apply("ab") == "-a-b-"
    assert RemapRule("", "-").apply("") == "-"


# ---------------------------------------------------------------------------------------------
# Replacement syntax: Rust rules and traps
# ---------------------------------------------------------------------------------------------

GROUPS = r"(?P<name>a)(b)?(c)"


@pytest.mark.parametrize(
    ("replacement", "expected"),
    [
        ("$1_x", "[]"),  # group named '1_x' -> empty
        ("${1}_x", "[a_x]"),
        ("$$", "[$]"),
        ("$$1", "[$1]"),
        ("$", "[$]"),
        ("a$", "[a$]"),
        ("$-", "[$-]"),
        ("${", "[${]"),
        ("${1", "[${1]"),
        ("$0", "[ac]"),
        ("${0}", "[ac]"),
        ("$3$1", "[ca]"),
        ("$2", "[]"),  # non-participating group
        ("$9", "[]"),  # missing group
        ("$99999999999999999999999", "[]"),  # overflows usize -> a name, missing
        ("$name", "[a]"),
        ("${name}", "[a]"),
        ("${name}s", "[as]"),
        ("$names", "[]"),  # longest run: 'names'
        ("$nope", "[]"),
        ("${}", "[]"),
        ("${+1}", "[a]"),  # braced refs are parsed as usize, which accepts '+'
        ("${ 1}", "[]"),
        ("é$1", "[éa]"),
    ],
)
def test_rust_replacement(replacement: str, expected: str) -> None:
    rule = RemapRule(GROUPS, replacement, "rust")
    assert "[" + rule.apply("ac") + "]" == expected


@pytest.mark.parametrize(
    ("replacement", "expected"),
    [
        ("\\$1", "\\a"),
        ("\\n", "\\n"),
        ("a\\\\b", "a\\\\b"),
        ("\\1", "\\1"),  # explicit rust syntax: backslash-digit is plain text
        ("\\g<1>", "\\g<1>"),
    ],
)
def test_rust_replacement_backslashes_are_literal(replacement: str, expected: str) -> None:
    assert RemapRule("(a)", replacement, "rust").apply("a") == expected


def test_rust_is_the_auto_default_without_python_refs() -> None:
    assert RemapRule("(a)", "\\n$1").apply("a") == "\\na"  # `$1` expanded, the backslash kept


def test_missing_groups_are_reported() -> None:
    assert RemapRule("(a)", "$1_x").missing_groups == ("1_x",)
    assert RemapRule("(a)", "${1}_x").missing_groups == ()
    assert RemapRule("(a)", "$2$foo").missing_groups == ("2", "foo")


@pytest.mark.parametrize(
    ("replacement", "expected"),
    [
        ("\\1-\\1", "x-x"),
        ("\\g<1>0", "x0"),
        ("\\g<word>!", "x!"),
        ("\\g<0>\\g<0>", "xx"),
        ("$1\\g<1>", "$1x"),
    ],
)
def test_python_replacement(replacement: str, expected: str) -> None:
    assert RemapRule("(?P<word>x)", replacement, "python").apply("x") == expected


@pytest.mark.parametrize(("replacement", "expected"), [("\\1.", "a."), ("pre.\\g<1>", "pre.a"), ("\\g<name>", "a")])
def test_auto_detects_python(replacement: str, expected: str) -> None:
    assert RemapRule("(?P<name>a)", replacement).apply("a") == expected


def test_python_non_participating_group_is_empty() -> None:
    assert RemapRule("(a)|(b)", "[\\1]").apply("b") == "[]"


def test_auto_rejects_mixed_reference_styles() -> None:
    with pytest.raises(NamingError, match="mixes"):
        RemapRule("(a)", "$1\\1")
    assert RemapRule("(a)", "$$\\1").apply("a") == "$$a"  # '$$' is no group reference


@pytest.mark.parametrize("replacement", ["\\2", "\\g<nope>", "\\g<1", "\\q"])
def test_invalid_python_replacement(replacement: str) -> None:
    with pytest.raises(NamingError):
        RemapRule("(a)", replacement, "python")


def test_unknown_syntax() -> None:
    with pytest.raises(NamingError, match="syntax"):
        RemapRule("a", "b", "perl")  # type: ignore[arg-type]


def test_python_syntax_also_uses_rust_iteration() -> None:
    assert RemapRule("(x*)", "<\\1>", "python").apply("axb") == "<>a<x>b<>"


# ---------------------------------------------------------------------------------------------
# Regex dialect
# ---------------------------------------------------------------------------------------------


def test_dollar_matches_only_at_the_very_end() -> None:
    rule = RemapRule(r"\.gamma$", ".weight")
    assert rule.apply("a.gamma") == "a.weight"
    assert rule.apply("a.gamma\n") == "a.gamma\n"  # Python's bare $ would match here
    assert compile_regex(r"a$").pattern == r"a$"  # RE2's $ is Rust's already
    assert not compile_regex(r"a\Z").search("a\n") and compile_regex(r"a\Z").search("a")


@pytest.mark.parametrize(
    ("pattern", "translated"),
    [
        (r"\$", r"\$"),
        (r"\\$", r"\\$"),
        (r"[]$]", r"[\]$]"),
        (r"a\Z", r"a\z"),
        (r"(?m)a$", r"(?m)a$"),
        (r"(?<n>x)", r"(?P<n>x)"),
        (r"(?P<n>x)", r"(?P<n>x)"),
        (r"a(?i)b|c", r"a(?i)b|c"),
        (r"\x{1F600}", r"\x{1F600}"),
        (r"\u{e9}", r"\x{E9}"),
        (r"\u00e9\U0001F600", r"\x{E9}\x{1F600}"),
        (r"[[:digit:]_]", r"[[:digit:]_]"),
        (r"(?x) a b # c", r"ab"),
        (r"(?ix:a b)", r"(?i:ab)"),
        (r"(?#note)a", r"a"),
        (r"\d", r"[\p{Nd}]"),
        (r"(?a)\d", r"\d"),
        (r"\bx", r"\bx"),
    ],
)
def test_translation(pattern: str, translated: str) -> None:
    assert compile_regex(pattern).pattern == translated


def test_translated_semantics() -> None:
    """Rust's answers (regex crate 1.x), checked on RE2."""
    assert compile_regex(r"a(?i)b|c").fullmatch("aB")
    assert compile_regex(r"a(?i)b|c").fullmatch("C")  # a bare flag holds to the end of its group
    assert not compile_regex(r"(x(?i)y)z").fullmatch("xYZ")
    assert compile_regex(r"(?<n>x)").fullmatch("x").group("n") == "x"
    assert compile_regex(r"(?x) a b # trailing comment $ )").fullmatch("ab")
    assert compile_regex(r"(?x)[a b]").fullmatch("a")
    assert not compile_regex(r"(?x)[a b]").fullmatch(" ")
    assert compile_regex(r"^\w+$").fullmatch("poids_é2")  # \w is Unicode, as in Rust
    assert compile_regex(r"\d").fullmatch("٣") and not compile_regex(r"(?a)\d").search("٣")
    assert compile_regex(r"\p{Greek}+").fullmatch("αβ")
    assert compile_regex(r"[[:^alpha:]]").fullmatch("1")
    assert compile_regex(r"(?U)a+").match("aaa").group(0) == "a"  # swap greed


def test_matches_are_in_characters_on_non_ascii_names() -> None:
    m = compile_regex(r"é(\w+)\.(x)?").search("layerçé12.w", 3)
    assert m is not None and m.span() == (6, 10) and m.span(1) == (7, 9) and m.group(2) is None
    assert m.groups() == ("12", None) and m.string[m.start():m.end()] == "é12."
    assert RemapRule(r"(é+)", "<$1>").apply("aéébé") == "a<éé>b<é>"


@pytest.mark.parametrize(
    ("pattern", "message", "position"),
    [
        (r"[a-z&&[^aeiou]]", "set operation", 4),
        (r"[a--b]", "set operation", 2),
        (r"[[a]]", "nested", 1),
        (r"[[:alfa:]]", "ASCII class", 1),
        (r"(?-u)\w", "ASCII", 0),
        (r"(?R)a", "flag", 0),
        (r"(abc", "invalid regex", 0),
        (r"abc)", "invalid regex", 3),
        (r"a**", "invalid regex", 1),
        (r"\b{start}", "word assertion|end-of-word", 0),
        (r"x\<ab", "end-of-word", 1),
        (r"(?<=a)b", "look-behind", 0),
        (r"a(?!b)", "look-ahead", 1),
        (r"(a)\1", "back-references", 3),
        (r"(?P<n>a)(?P=n)", "back-references", 8),
        (r"a{1001}", "at most 1000", None),
        (r"\x{110000}", "scalar", 0),
        (r"\u12", "hex digits", 0),
        (r"(?<n>a)(?<n>b)", "duplicate group name", 7),
        ("a\\", "lone backslash", 1),
    ],
)
def test_invalid_patterns(pattern: str, message: str, position: int | None) -> None:
    with pytest.raises(NamingError, match=message) as info:
        RemapRule(pattern, "x")
    err = info.value
    assert isinstance(err, ValueError)
    assert err.pattern == pattern
    if position is not None:
        assert err.position == position
    assert repr(pattern) in str(err)


def test_key_remapper_add_pattern_fails_immediately() -> None:
    remapper = KeyRemapper()
    with pytest.raises(NamingError):
        remapper.add_pattern("[invalid", "x")
    assert len(remapper) == 0


# ---------------------------------------------------------------------------------------------
# contiguous_names
# ---------------------------------------------------------------------------------------------


def _mapped(names: list[str]) -> list[str]:
    return contiguous_names(names)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (
            ["fc.0.weight", "fc.0.bias", "fc.2.weight", "fc.2.bias", "fc.4.weight", "fc.4.bias"],
            ["fc.0.weight", "fc.0.bias", "fc.1.weight", "fc.1.bias", "fc.2.weight", "fc.2.bias"],
        ),
        (["fc.0.weight", "fc.1.weight", "fc.2.weight"], ["fc.0.weight", "fc.1.weight", "fc.2.weight"]),
        (
            ["encoder.0.weight", "encoder.2.weight", "decoder.1.weight", "decoder.5.weight"],
            ["encoder.0.weight", "encoder.1.weight", "decoder.0.weight", "decoder.1.weight"],
        ),
        (
            [
                "feature.layers.0.conv_block.0.weight",
                "feature.layers.0.conv_block.2.weight",
                "feature.layers.2.conv_block.0.weight",
                "feature.layers.2.conv_block.2.weight",
            ],
            [
                "feature.layers.0.conv_block.0.weight",
                "feature.layers.0.conv_block.1.weight",
                "feature.layers.1.conv_block.0.weight",
                "feature.layers.1.conv_block.1.weight",
            ],
        ),
        (
            ["a.0.b.0.c.0.w", "a.0.b.0.c.2.w", "a.0.b.2.c.0.w", "a.2.b.0.c.0.w"],
            ["a.0.b.0.c.0.w", "a.0.b.0.c.1.w", "a.0.b.1.c.0.w", "a.1.b.0.c.0.w"],
        ),
        (["output.weight"], ["output.weight"]),
        ([], []),
        (["fc.0.w", "fc.4.w", "head.weight"], ["fc.0.w", "fc.1.w", "head.weight"]),
        (["layer.1.weight"], ["layer.0.weight"]),  # lone indices are renumbered too
        (["5.w", "9.w"], ["0.w", "1.w"]),  # index at position 0: key ''
        (["fc.01", "fc.1"], ["fc.0", "fc.0"]),  # two spellings collapse
        (["fc.007.w", "fc.3.w", "fc.10.w"], ["fc.1.w", "fc.0.w", "fc.2.w"]),  # '007' is 7
        (["x.+3", "x.1"], ["x.1", "x.0"]),  # Rust usize accepts a leading '+'
        (["x.-1", "x.1"], ["x.-1", "x.0"]),
        (["x.18446744073709551615", "x.2"], ["x.1", "x.0"]),  # u64::MAX is an index
        (["x.18446744073709551616", "x.2"], ["x.18446744073709551616", "x.0"]),  # overflow: not
        (["x.1_0", "x. 1", "x.١", "x.+", "x.", "x.2"], ["x.1_0", "x. 1", "x.١", "x.+", "x.", "x.0"]),
        (["a.3.3", "a.5.3", "a.3.7"], ["a.0.0", "a.1.0", "a.0.1"]),  # keys use the original prefix
    ],
)
def test_contiguous_names(names: list[str], expected: list[str]) -> None:
    assert _mapped(names) == expected


def test_indices_after_remap_shift_rest_of_sequence() -> None:
    remapped = [
        new
        for new, _ in KeyRemapper([(r"conv_blocks\.0\.(.*)", "conv1.$1")]).remap(
            ["conv_blocks.0.weight", "conv_blocks.1.weight"]
        )
    ]
    assert _mapped(remapped) == ["conv1.weight", "conv_blocks.0.weight"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("007", 7),
        ("+3", 3),
        ("18446744073709551615", 2**64 - 1),
        ("18446744073709551616", None),
        ("", None),
        ("+", None),
        ("-1", None),
        ("1_0", None),
        (" 1", None),
        ("١", None),
        ("++1", None),
    ],
)
def test_parse_usize(text: str, value: int | None) -> None:
    assert parse_usize(text) == value


_segment = st.one_of(
    st.from_regex(r"[a-z_]{1,5}", fullmatch=True),
    st.integers(min_value=0, max_value=30).map(str),
)
_names = st.lists(st.lists(_segment, min_size=1, max_size=5).map(".".join), max_size=30)


@given(_names)
def test_property_indices_keep_words_and_become_contiguous(names: list[str]) -> None:
    pairs = list(zip(contiguous_names(names), names, strict=True))
    per_key: dict[str, set[int]] = {}
    for new, orig in pairs:
        new_segments, old_segments = new.split("."), orig.split(".")
        assert len(new_segments) == len(old_segments)
        for i, (n, o) in enumerate(zip(new_segments, old_segments, strict=True)):
            if parse_usize(o) is None:
                assert n == o
            else:
                per_key.setdefault(".".join(old_segments[:i]), set()).add(int(n))
    for values in per_key.values():
        assert values == set(range(len(values)))


@given(_names)
def test_property_empty_remapper_is_identity(names: list[str]) -> None:
    assert KeyRemapper().remap(names) == [(n, n) for n in names]


@given(st.text(max_size=20))
def test_property_literal_rule_matches_str_replace(text: str) -> None:
    assert RemapRule(re.escape("ab"), "X").apply(text) == text.replace("ab", "X")


# ---------------------------------------------------------------------------------------------
# Enum variants, collisions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("feature.BaseConv.weight", "feature.weight"),
        ("a.Foo.Bar.w", "a.Bar.w"),  # only the first variant-like segment
        ("BaseConv.weight", None),  # first segment never
        ("feature.BaseConv", None),  # last segment never
        ("feature.CONV.weight", None),  # no lowercase after the first char
        ("feature.A.weight", None),  # single character
        ("feature.conv.weight", None),
        ("feature.Éa.weight", "feature.weight"),  # Unicode upper/lower
        ("a..b", None),
        ("weight", None),
    ],
)
def test_strip_enum_variant(path: str, expected: str | None) -> None:
    assert strip_enum_variant(path) == expected


def test_find_collisions() -> None:
    pairs = [("fc.0", "fc.01"), ("fc.0", "fc.1"), ("x", "x"), ("y", "a"), ("y", "b"), ("y", "c")]
    assert find_collisions(pairs) == {"fc.0": ["fc.01", "fc.1"], "y": ["a", "b", "c"]}
    assert find_collisions([("a", "a"), ("b", "b")]) == {}


# ---------------------------------------------------------------------------------------------
# regexes as recipe filters use them (plan.py compiles them with compile_regex)
# ---------------------------------------------------------------------------------------------


def test_filter_regex_is_an_unanchored_search() -> None:
    assert compile_regex(r"^encoder\.").search("encoder.layer.weight")
    assert compile_regex("layer").search("enc.layer1.w")
    assert compile_regex(r"(^|.*\.)layers\.0\.").search("model.layers.0.bias")
    assert not compile_regex(r"(^|.*\.)layers\.0\.").search("mylayers.0.weight")


def test_invalid_filter_regex_raises() -> None:
    with pytest.raises(NamingError, match="invalid"):
        compile_regex("[invalid")
    with pytest.raises(NamingError):
        compile_regex(r"(?=x)")


def test_filter_regex_uses_rust_dollar() -> None:
    assert not compile_regex(r"weight$").search("fc.weight\n")
    assert compile_regex(r"weight$").search("fc.weight")


# ---------------------------------------------------------------------------------------------
# contiguous_names: the per-prefix implementation against a plain per-segment reference
# ---------------------------------------------------------------------------------------------


def _reference_contiguous(names: list[str]) -> list[str]:
    """The rule spelled out: collect every index value per original prefix, then renumber by rank."""
    def indices(name: str) -> list[tuple[int, str, int]]:
        segments = name.split(".")
        found = []
        for i, seg in enumerate(segments):
            value = parse_usize(seg)
            if value is not None:
                found.append((i, ".".join(segments[:i]) + "." if i else "", value))
        return found

    values: dict[str, set[int]] = {}
    for name in names:
        for _, key, value in indices(name):
            values.setdefault(key, set()).add(value)
    out = []
    for name in names:
        segments = name.split(".")
        for i, key, value in indices(name):
            segments[i] = str(sorted(values[key]).index(value))
        out.append(".".join(segments))
    return out


_SEGMENT = st.sampled_from(["0", "1", "2", "3", "7", "10", "01", "+2", "+", "", "a", "b", "w", "x1", "1x", "²",
                            "99999999999999999999999", "18446744073709551615", "Conv"])


@given(st.lists(st.lists(_SEGMENT, min_size=1, max_size=5).map(".".join), max_size=30))
def test_contiguous_fast_path_matches_reference(names: list[str]) -> None:
    assert contiguous_names(names) == _reference_contiguous(names)


def test_contiguous_keeps_unchanged_names_and_handles_deep_gaps() -> None:
    names = [f"h.{i}.blocks.{j}.w" for i in (0, 2, 5) for j in (1, 3)] + ["top", "h.2.x", "0", ".4.w"]
    assert contiguous_names(names) == _reference_contiguous(names)
    already = ["a.0.w", "a.1.w", "b"]
    assert all(new is old for new, old in zip(contiguous_names(already), already, strict=True))


def test_peft_pattern_keys_run_on_re2_and_match_as_peft_does() -> None:
    """rank_pattern / alpha_pattern keys come from adapter_config.json: PEFT's rule (re.match of
    `(.*\\.)?(KEY)$`) is the oracle; a catastrophic key returns at once; look-around is refused."""
    import re

    from migrator.core.errors import AdapterError
    from migrator.transform.merging.peft_adapter import parse_config, pattern_key

    keys = {"q_proj": 1, r"layers\.0\.self_attn\.v_proj": 2, "mlp.*": 3, "(a+)+": 4}
    for module in ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj", "layers.1.mlp.up",
                   "x.q_proj_b", "a" * 12 + "!", "model.aaaa"]:  # Python's re, the oracle, is exponential here
        want = next((k for k in keys if re.match(rf"(.*\.)?({k})$", module)), module)
        assert pattern_key(keys, module) == want, module
    assert pattern_key(keys, "a" * 40 + "!") == "a" * 40 + "!"  # RE2: at once (re: ~2^40 steps)
    with pytest.raises(AdapterError, match="look-ahead"):
        parse_config({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "rank_pattern": {"(?=q)q_proj": 2}},
                     "adapter_config.json")

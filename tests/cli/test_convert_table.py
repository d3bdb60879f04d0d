"""`convert`'s one table of options (`recipe/convert_options.py`): the parser, the choices, the
one-off recipe and the error names all come from it, and `diff` takes its subset from it.

The oracles are what the table must agree with without being derived from it: the recipe model
(its fields and Literals, which the JSON Schema publishes), the formats' and the GGUF writer's
own lists, and the recipe loader's error locations."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import numpy as np
import pytest

from migrator.cli import _parser, main
from migrator.recipe.convert_options import DIFF, GROUPS, KINDS, PLAIN, TRAINING_STATES, ConvertOptions, flag_for, table

SAMPLES: dict[str, object] = {
    "source_format": "safetensors", "top_level_key": "model", "tag": "global_step3", "contiguous_indices": False,
    "target_format_name": "safetensors", "overwrite": True, "fsync": False, "metadata": {"k": "v"},
    "clear_metadata": True, "copy_from": "hf", "training_state": "drop", "optimizer": "o.bpk", "param_order": "o.pt",
    "add_tokens": "new.txt",
}
"""A value other than the default for each option placed in the recipe as it is."""


def _convert_actions() -> dict[str, object]:
    return {a.dest: a for a in _parser()[1]["convert"]._actions}


def test_every_field_is_one_row_and_one_option() -> None:
    rows = table()
    assert [r.name for r in rows] == [f.name for f in dataclasses.fields(ConvertOptions)]
    assert len({r.flag for r in rows}) == len(rows)
    actions = _convert_actions()
    for r in rows:
        assert r.group in GROUPS and r.kind in KINDS and r.help, r.name
        assert r.flag in actions[r.name].option_strings  # type: ignore[attr-defined]
    own = {"help", "src", "dst", "json", "no_progress", "limits", "emit_recipe", "recipe_output"}
    assert set(actions) == {r.name for r in rows} | own  # nothing declared beside the table


def test_help_groups_are_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    out = capsys.readouterr().out
    titles = [title for title, _ in GROUPS.values()]
    at = [out.index(f"\n{title}:\n") for title in titles]
    assert at == sorted(at)  # in the table's order
    for r in table():  # each row under its own group's title, before the next one's
        i = titles.index(GROUPS[r.group][0])
        end = at[i + 1] if i + 1 < len(at) else len(out)
        assert r.flag in out[at[i]:end], r.flag


def test_choices_come_from_the_lists_they_name() -> None:
    from migrator.core.casts import CASTABLE
    from migrator.formats import registry
    from migrator.formats.gguf.writer import WRITABLE_TYPES
    from migrator.recipe import model

    actions = _convert_actions()
    diff = {a.dest: a for a in _parser()[1]["diff"]._actions}
    readable = ["auto", *(s.name for s in registry.specs() if s.reader is not None and not s.folder)]
    writable = ["auto", *(s.name for s in registry.specs() if s.writer is not None)]
    assert list(actions["source_format"].choices) == readable == list(diff["target_format_name"].choices)
    assert list(actions["target_format_name"].choices) == writable
    assert tuple(actions["training_state"].choices) == TRAINING_STATES  # type: ignore[attr-defined]
    annotation = model.Recipe.model_fields["training_state"].annotation
    assert next(typing.get_args(a) for a in typing.get_args(annotation) if typing.get_args(a)) == TRAINING_STATES
    text = _parser()[1]["convert"].format_help()
    flat = " ".join(text.split())
    for name in (*typing.get_args(model.GGUFTypeName), *typing.get_args(model.GGUFMixName), *WRITABLE_TYPES,
                 *typing.get_args(model.QuantizeSchemeName)):
        assert name in flat.split("TYPE:", 1)[1].split("writing DST:")[0], name
    dtypes = flat.split("--dtype DTYPE cast every float tensor (", 1)[1].split(")")[0]
    assert sorted(d.upper() for d in dtypes.split(", ")) == sorted(CASTABLE)


def test_help_does_not_import_what_the_lists_come_from() -> None:
    import subprocess
    import sys

    code = ("import sys; from migrator.cli import _parser\n_parser()\n"
            "print(sorted(m for m in ('numpy', 'pydantic', 'migrator.formats.detect') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_placed_option_lands_where_its_row_says(name: str, tmp_path: Path) -> None:
    """The recipe model's own attribute at the row's location holds the value (the recipe model
    is the oracle: a wrong location is refused by it or lands elsewhere)."""
    from migrator.recipe.convert import build_recipe

    r = next(r for r in table() if r.name == name)
    assert r.place and r.recipe is not None
    value = SAMPLES[name]
    if name == "optimizer":
        recipe = build_recipe(tmp_path / "a.pt", tmp_path / "b.bpk", training_state="keep", optimizer=value)
    elif name == "copy_from":
        recipe = build_recipe(tmp_path / "a.pt", f"{tmp_path}/out/", copy=["config.json"], copy_from=value)
    else:
        recipe = build_recipe(tmp_path / "a.pt", tmp_path / "b.safetensors", **{name: value})
    found: object = recipe
    for part in r.recipe.split("."):
        found = getattr(found, part)
    assert (str(found) if name in ("copy_from", "optimizer", "param_order", "add_tokens") else found) == value
    assert set(SAMPLES) == {r.name for r in table() if r.place}


def test_errors_name_the_option_from_its_row(tmp_path: Path) -> None:
    """A value the recipe model refuses is named by its option: the loader's location (the oracle)
    mapped through the table."""
    from migrator.recipe.convert import ConvertUsageError, build_recipe

    cases = {"dtype": "F17", "quantize": "Q9_9", "training_state": "bogus", "top_level_key": 3}
    for name, value in cases.items():
        flag = next(r.flag for r in table() if r.name == name)
        with pytest.raises(ConvertUsageError, match=r"invalid option: " + flag + ": "):
            build_recipe(tmp_path / "a.safetensors", tmp_path / "b.gguf", **{name: value})
    assert flag_for("source.lora.scale") == "--lora/--lora-scale"
    assert flag_for("target.shard.name") == "--weights-name" and flag_for("target.path") == "DST"
    assert flag_for("adapters[1].float_cast.to") == "--adapter" and flag_for("target.quantize['.*']") == "--quantize"


def test_a_plain_copy_takes_the_rows_marked_plain() -> None:
    from migrator.run import convert

    assert convert.PLAIN_OPTIONS == PLAIN
    assert "contiguous_indices" not in PLAIN and "remaps" not in PLAIN  # these need the recipe's plan


def test_diff_takes_convert_rows_with_their_help() -> None:
    from migrator.analysis.diff import PLAN_OPTIONS
    from migrator.cli.diff import _for_a_and_b

    commands = _parser()[1]
    convert = {a.dest: a for a in commands["convert"]._actions}
    diff = {a.dest: a for a in commands["diff"]._actions}
    assert PLAN_OPTIONS == DIFF
    for name in (*DIFF, "target_format_name"):
        assert diff[name].help == _for_a_and_b(convert[name].help), name
        assert diff[name].option_strings[0] == convert[name].option_strings[0]
    assert "SRC" not in " ".join(diff[n].help for n in DIFF)


def test_diff_old_and_new_spellings_compare_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A PyTorch file and a SafeTensors one, both named .bin, holding torch's tensors: each spelling of
    the two formats reads them as what they are (the oracle: torch and safetensors wrote them)."""
    import json

    import torch
    from safetensors.torch import save_file

    weights = {"w": torch.arange(4, dtype=torch.float32)}
    torch.save(weights, tmp_path / "a.bin")
    save_file({"w": torch.arange(4, dtype=torch.float32) + 1}, tmp_path / "b.bin")
    docs = []
    for flags in (["--from", "pytorch", "--to", "safetensors"], ["--a-format", "pytorch", "--b-format", "safetensors"],
                  ["--a-format=pytorch", "--b-format=safetensors"]):
        assert main(["diff", str(tmp_path / "a.bin"), str(tmp_path / "b.bin"), "--json", *flags]) == 1
        out, err = capsys.readouterr()
        doc = json.loads(out)
        assert (doc["a_format"], doc["b_format"]) == ("pytorch", "safetensors")
        assert doc["tensors"][0]["max_abs_diff"] == 1.0
        assert ("is now spelled" in err) == (flags[0] != "--from")
        docs.append(doc)
    assert docs[0] == docs[1] == docs[2]


def test_inspect_rows_and_the_old_limit_n(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.numpy import save_file

    path = tmp_path / "m.safetensors"
    save_file({f"t{i}": np.zeros(1, np.float32) for i in range(5)}, str(path))
    outs = []
    for flags in (["--rows", "2"], ["--limit", "2"], ["--limit", "2", "--limit", "max_tensors=9"]):
        assert main(["inspect", str(path), *flags]) == 0
        out, err = capsys.readouterr()
        assert "... and 3 more tensors (use --rows N or --json)" in out
        assert ("--limit 2 (rows shown) is now spelled --rows 2" in err) == (flags[0] == "--limit")
        outs.append(out)
    assert outs[0] == outs[1] == outs[2]
    assert main(["inspect", str(path), "--rows", "0"]) == 0 and "5 more tensors" in capsys.readouterr().out
    for bad in (["--rows", "-1"], ["--limit", "-1"], ["--limit", "x"]):
        with pytest.raises(SystemExit) as exit:
            main(["inspect", str(path), *bad])
        assert exit.value.code == 2
    assert "--limit: expected NAME=VALUE" in capsys.readouterr().err

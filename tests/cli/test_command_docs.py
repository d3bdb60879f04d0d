"""The README's command table and docs/commands.md against `--help`: every command and every option
documented, none stale, and the old spellings the docs promise still parse."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from migrator.cli import _parser, main
from migrator.cli.options import OLD_SPELLINGS

REPO = Path(__file__).resolve().parents[2]
OPTION = re.compile(r"(?<![\w-])(--\[no-\][a-z][\w-]*|--?[a-z][\w-]*)")


def _visible(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings `--help` shows (not -h/--help, not old spellings)."""
    return {s for a in parser._actions for s in a.option_strings
            if s not in ("-h", "--help") and s not in OLD_SPELLINGS and a.help != argparse.SUPPRESS}


def _options_in(text: str) -> set[str]:
    found: set[str] = set()
    for token in OPTION.findall(text):
        if token.startswith("--[no-]"):
            found |= {"--" + token[7:], "--no-" + token[7:]}
        else:
            found.add(token)
    return found


def _readme_rows() -> dict[str, str]:
    text = (REPO / "README.md").read_text()
    table = text.split("## Commands", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        command = re.match(r"`migrate (\w+)", cells[0])
        assert command is not None, line
        rows[command.group(1)] = cells[2]
    return rows


def _docs_sections() -> dict[str, str]:
    text = (REPO / "docs" / "commands.md").read_text()
    every = text.split("\n## Every option\n", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"### `migrate (\w+)[^`]*`\n(.*?)(?=\n### |\Z)", every, re.S)}


def test_every_command_is_in_the_readme_table_and_in_docs_commands() -> None:
    _, commands = _parser()
    assert sorted(_readme_rows()) == sorted(commands)
    assert list(_docs_sections()) == list(commands)  # in `migrate --help`'s order


@pytest.mark.parametrize("command", list(_parser()[1]))
def test_docs_commands_lists_exactly_the_options_of_help(command: str) -> None:
    parser = _parser()[1][command]
    assert _options_in(_docs_sections()[command]) == _visible(parser)


@pytest.mark.parametrize("command", list(_parser()[1]))
def test_the_readme_table_names_no_option_the_command_lacks(command: str) -> None:
    parser = _parser()[1][command]
    named = _options_in(_readme_rows()[command])
    assert named and named <= _visible(parser), named - _visible(parser)


def test_the_docs_group_options_as_help_does() -> None:
    """docs/commands.md lists convert's and diff's options under the titles of `--help`'s groups."""
    sections = _docs_sections()
    for command in ("convert", "diff"):
        parser = _parser()[1][command]
        for group in parser._action_groups:
            shown = {s for a in group._group_actions for s in a.option_strings} & _visible(parser)
            if not shown:
                continue
            line = next(line for line in sections[command].splitlines() if line.startswith(f"- {group.title}:"))
            assert _options_in(line) == shown, group.title


def test_help_hides_the_old_spellings_that_still_parse(capsys: pytest.CaptureFixture[str]) -> None:
    _, commands = _parser()
    for command in ("inspect", "diff"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        taken = {s for a in commands[command]._actions for s in a.option_strings}
        for old, new in OLD_SPELLINGS.items():
            if old in taken:
                assert new in out and not re.search(rf"(?<![\w-]){re.escape(old)}(?![\w-])", out), (command, old)
    docs = (REPO / "docs" / "commands.md").read_text().split("## Old spellings", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{old} FORMAT`" in docs and f"`{new} FORMAT`" in docs for old, new in OLD_SPELLINGS.items())


def _old_spellings_block() -> list[str]:
    docs = (REPO / "docs" / "commands.md").read_text().split("## Old spellings", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", docs, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_old_spellings_example_runs_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The block under "Old spellings", each line as written and as its `# was:` comment spells it:
    the same result, the old one with a note. Oracles: the files are written by safetensors and torch,
    so A (PyTorch, named .bin) and B (SafeTensors, named .bin) hold the same tensors."""
    import torch
    from safetensors.numpy import save_file
    from safetensors.torch import save_file as save_torch

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(7)
    save_file({f"w{i}": rng.standard_normal((2, 3)).astype(np.float32) for i in range(25)}, "model.safetensors")
    weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    torch.save(weights, "a.bin")
    save_torch(weights, "b.bin")
    for line in _old_spellings_block():
        command, _, was = line.partition("# was:")
        argv = shlex.split(command)[1:]
        code = main(argv)
        new_out, new_err = capsys.readouterr()
        assert code == 0, new_err
        assert "note:" not in new_err
        old_argv = argv[:2] + shlex.split(was)
        if argv[0] == "diff":
            old_argv = argv[:3] + shlex.split(was)
        assert main(old_argv) == 0
        old_out, old_err = capsys.readouterr()
        assert old_out == new_out and "is now spelled" in old_err
        if argv[0] == "inspect":  # 20 of the file's 25 tensors shown
            assert len(re.findall(r"^w\d+ ", new_out, re.M)) == 20 and "5 more tensors" in new_out
        else:
            assert "A and B match" in new_out


def test_a_wrong_format_flag_is_refused_as_a_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--from on a SafeTensors file named .bin: the bytes are SafeTensors (safetensors wrote them), so
    reading it as PyTorch fails whichever spelling asks for it."""
    from safetensors.numpy import load_file, save_file

    path = tmp_path / "m.bin"
    save_file({"w": np.ones((2, 2), np.float32)}, str(path))
    for flag in ("--from", "--format"):
        assert main(["inspect", str(path), flag, "safetensors", "--json"]) == 0
        import json

        doc = json.loads(capsys.readouterr().out)
        assert [(t["name"], t["shape"]) for t in doc["tensors"]] == [
            (k, list(v.shape)) for k, v in load_file(str(path)).items()]
        assert main(["inspect", str(path), flag, "pytorch"]) == 1
        capsys.readouterr()
    for flag in ("--from", "--format"):
        with pytest.raises(SystemExit) as exit:
            main(["inspect", str(path), flag, "safetensor"])
        assert exit.value.code == 2
        err = capsys.readouterr().err
        assert "argument --from: unknown format 'safetensor' (did you mean 'safetensors'?" in err and "gguf" in err

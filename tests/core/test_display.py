"""Untrusted text on a terminal: shown literally and escaped everywhere, exact under --json.

Files are written with the `safetensors` library (names, metadata exactly as given), so what
`migrate` shows is compared with what the file really holds, not with migrator's own writer.
"""

from __future__ import annotations

import io
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from migrator.cli import _parser, main
from migrator.core.display import count, escape, human_bytes, print_table, wrap
from migrator.plan.report import ApplyReport, ReportError

MARKUP = ["encoder[bold].weight", "a[/]b", "x[/bold]y", "[link=file:///etc/passwd]z[/link]", "\\[esc].w",
          "[red]", "[/]"]
ESCAPES = ["osc52\x1b]52;c;aGVsbG8=\x07.w", "csi\x1b[2J\x1b[H.w", "title\x1b]0;pwned\x07.w", "bel\x07.w",
           "c1\x9b31m.w", "osc8\x9d8;;http://x\x9c.w", "bidi\u202egnp.w", "iso\u2066x\u2069.w", "del\x7f.w",
           "nul\x00.w", "nl\nforged row.w", "cr\rover.w", "tab\t.w", "ls\u2028.w", "zw\u200b.w"]
CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]
BIDI = ["\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))]


def inert(text: str) -> bool:
    """Nothing a terminal would act on: every character printable, except the newlines."""
    return all(ch.isprintable() or ch == "\n" for ch in text)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)


# --- escape(), the one rule --------------------------------------------------------------------

@pytest.mark.parametrize("ch", CONTROLS + BIDI + ["\ud800", "\udfff", "\u2029", "\u00a0", "\ufeff"])
def test_every_control_and_bidi_character_is_escaped_visibly(ch: str) -> None:
    code = ord(ch)
    want = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    assert escape(f"a{ch}b") == f"a{want}b"
    assert inert(escape(ch * 3)) and escape(ch * 3) == want * 3


def test_printable_text_and_markup_are_kept_as_they_are() -> None:
    for text in [*MARKUP, "é.poids", "层.权重", "emoji😀", "back\\slash", ""]:
        assert escape(text) == text
    assert escape("line1\nline2\x1b", keep_newlines=True) == "line1\nline2\\x1b"
    assert escape("\U000e0001") == "\\U000e0001"  # a tag character outside the BMP
    assert escape(ReportError("x", "load_error", "y")) == "Load error for 'x': y"  # any object, by str()


def test_sizes_are_iec_with_one_decimal_and_counts_agree_in_number() -> None:
    cases = {0: "0 B", 1: "1 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 1024**2 - 1: "1.0 MiB",
             5 * 1024**2 + 1024**2 // 10 * 3: "5.3 MiB", 3 * 1024**3: "3.0 GiB", 2 * 1024**4: "2.0 TiB"}
    for n, text in cases.items():
        assert human_bytes(n) == text, n
    assert [count(n, "tensor") for n in (0, 1, 2)] == ["0 tensors", "1 tensor", "2 tensors"]
    assert count(1234, "entry", "entries") == "1,234 entries"


def test_wrap_breaks_after_dots_and_splits_only_a_piece_with_none() -> None:
    name = "encoder.layer.10.attention.self.query.weight"
    lines = wrap(name, 16)
    assert "".join(lines) == name and all(len(line) <= 16 for line in lines)
    assert all(line.endswith(".") for line in lines[:-1])
    assert wrap("abcdefghijklmnopqrstuvwxyz", 10) == ["abcdefghij", "klmnopqrst", "uvwxyz"]
    assert wrap("short", 10) == ["short"]
    wide = wrap("层层层层层.层", 6)  # wide characters take two columns each
    assert "".join(wide) == "层层层层层.层" and all(len(line) * 2 <= 6 or line == "层." for line in wide)


# --- tables: plain and Rich ----------------------------------------------------------------------

@pytest.mark.parametrize("rich", [False, True])
def test_tables_show_markup_and_escapes_literally(rich: bool) -> None:
    out = io.StringIO()
    rows = [(name, "F32", "[2]") for name in MARKUP + ESCAPES]
    print_table("title [bold]\x1b[2J", ("name", "dtype", "shape"), rows, stream=out, rich=rich)
    text = out.getvalue()
    assert inert(text)
    for name in MARKUP + ESCAPES:
        assert escape(name) in text, name
    assert "title [bold]\\x1b[2J" in text
    assert "forged row" in text and not any(line.startswith("forged") for line in text.splitlines())


@pytest.mark.parametrize("rich", [False, True])
def test_tables_fit_the_width_by_wrapping_names_at_dots(rich: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "48")
    names = [f"model.encoder.layers.{i}.self_attention.query_projection.weight" for i in range(3)]
    out = io.StringIO()
    print_table("t", ("name", "dtype", "size"), [(n, "F32", "16 B") for n in names], right=(2,), stream=out, rich=rich)
    lines = out.getvalue().splitlines()
    assert max(map(len, lines)) <= 48
    pieces = re.findall(r"[\w.]+", out.getvalue())
    assert not any(p.startswith(("ncoder", "ayers", "elf_", "uery")) for p in pieces)  # never mid-word
    joined = "".join(p for p in pieces if p not in ("t", "name", "dtype", "size", "F32", "16", "B"))
    assert joined == "".join(names)


def test_fit_table_shrinks_the_widest_wrap_columns_first() -> None:
    from migrator.core.display import fit_table

    assert fit_table([40, 5, 30], (0, 2), None) == [40, 5, 30]  # piped: no limit
    assert fit_table([40, 5, 30], (0, 2), 100) == [40, 5, 30]  # fits already
    assert fit_table([40, 5, 30], (0, 2), 60) == [25, 5, 26]  # 4 columns of gaps; the widest shrinks first
    assert fit_table([40, 5, 30], (0, 2), 20) == [5, 5, 6]  # below the usual floor: the last resort
    assert fit_table([40, 5, 30], (0,), 30) == [4, 5, 30]  # cannot fit: the last-resort floor, the rest as is


@pytest.mark.parametrize("columns", [80, 100])
def test_plan_table_fits_the_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str], columns: int) -> None:
    save_file({f"model.encoder.layers.{i}.self_attn.q_proj.weight": np.ones((4, 3), np.float32) for i in range(3)},
              str(tmp_path / "p.safetensors"))
    (tmp_path / "p.yaml").write_text("version: 1\nsource: {path: p.safetensors}\nadapters: [pytorch_to_burn]\n"
                                     "modules: {Linear: ['q_proj$']}\ndtype: {cast: F16}\ntarget: {path: p.bpk}\n")
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = run(capsys, "plan", str(tmp_path / "p.yaml"))
    assert code == 0, err
    table = out.split("┌─ Tensor Loading Summary")[0].splitlines()
    assert max(map(len, table)) <= columns
    assert "self_attn." in out and "self_att\n" not in out  # broken at dots only


# --- the commands ----------------------------------------------------------------------------------

@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.safetensors"
    names = MARKUP + ESCAPES + [f"ctl{c}.w" for c in CONTROLS + BIDI]
    save_file({n: np.full(2, i, np.float32) for i, n in enumerate(names)}, str(path),
              metadata={"k[/bold]\x1b]52;c;eA==\x07": "v\x1b[2J[/]\u202e", "format": "pt"})
    return path


def file_names(path: Path) -> list[str]:
    with safe_open(str(path), "np") as f:
        return list(f.keys())


def test_inspect_text_is_inert_and_json_is_exact(hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "inspect", str(hostile))
    assert code == 0, err
    assert inert(out) and err == ""
    names = file_names(hostile)
    for name in names:
        assert escape(name) in out, name
    assert "v\\x1b[2J[/]\\u202e" in out and "k[/bold]\\x1b]52;c;eA==\\x07" in out
    assert f"{count(len(names), 'tensor')}, {human_bytes(8 * len(names))}" in out
    code, out, _ = run(capsys, "inspect", str(hostile), "--json")
    info = json.loads(out)
    assert code == 0 and sorted(t["name"] for t in info["tensors"]) == sorted(names)
    assert info["metadata"]["k[/bold]\x1b]52;c;eA==\x07"] == "v\x1b[2J[/]\u202e"


def test_errors_escape_names_and_paths_and_json_keeps_them(hostile: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "inspect", str(hostile), "--top-level-key", "nope")
    assert code == 1 and out == "" and inert(err) and "Traceback" not in err
    assert "ctl\\x01, ctl\\x02" in err  # the top-level names the error lists
    code, out, err = run(capsys, "inspect", str(hostile), "--top-level-key", "nope", "--json")
    error = json.loads(out)["error"]
    assert code == 1 and error["kind"] == "TensorNotFoundError" and error["file"] == str(hostile)
    assert "ctl\x01, ctl\x02" in error["message"]
    for bad in ("m\x1b]52;c;eA==\x07.bpk", "t\x1b]0;title\x07[/].safetensors", "b\u202ekpb.pt"):
        code, out, err = run(capsys, "inspect", str(tmp_path / bad))
        assert code == 1 and inert(err) and escape(bad) in err
        code, out, _ = run(capsys, "inspect", str(tmp_path / bad), "--json")
        assert code == 1 and json.loads(out)["error"]["file"] == str(tmp_path / bad)


def test_plan_and_run_output_is_inert(hostile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nsource: {{path: {hostile.name}}}\ntarget: {{path: out.bpk}}\n")
    code, out, err = run(capsys, "plan", str(recipe))
    assert code == 0, err
    assert inert(out) and inert(err)
    names = file_names(hostile)
    for name in names:
        assert escape(name) in out, name
    code, out, _ = run(capsys, "plan", str(recipe), "--json")
    assert sorted(e["target"] for e in json.loads(out)["entries"]) == sorted(names)
    code, out, err = run(capsys, "run", str(recipe), "--no-progress")
    assert code == 0, err
    assert inert(out) and inert(err)
    assert f"Successfully applied: {count(len(names), 'tensor')}" in out
    assert f"{count(len(names), 'tensor')}, {human_bytes(8 * len(names))}" in out


def test_summary_escapes_missing_unused_and_error_names() -> None:
    missing, unused = "dec\x1b[2J[/].w", "enc\x07[bold].w"
    report = ApplyReport(applied=["a"], missing=[(missing, "")], unused=[unused, "dec\x1b[2J[/].x"],
                         errors=[ReportError("e\u202e.w", "load_error", "boom\x1b]52;c;eA==\x07")])
    text = report.display()
    assert inert(text)
    for name in (missing, unused, "e\u202e.w", "boom\x1b]52;c;eA==\x07"):
        assert escape(name) in text, name
    assert "│ ✓ Successfully applied: 1 tensor\n" in text and "│ ? Unused in source:     2 tensors" in text
    assert "│ ! Errors:               1 error\n" in text
    assert report.to_json()["missing"][0]["path"] == missing and report.to_json()["unused"][1] == unused


def test_plan_with_a_template_prints_missing_and_unused_escaped(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    save_file({"enc\x07[bold].w": np.ones(2, np.float32), "shared.w": np.ones(2, np.float32)},
              str(tmp_path / "src.safetensors"))
    save_file({"dec\x1b]0;t\x07[/].w": np.ones(2, np.float32), "shared.w": np.ones(2, np.float32)},
              str(tmp_path / "tpl.safetensors"))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: src.safetensors}\n"
                      "target: {path: out.safetensors, template: tpl.safetensors}\n")
    code, out, err = run(capsys, "plan", str(recipe))
    assert code == 1  # a template tensor the source lacks
    assert inert(out) and inert(err)
    assert "• dec\\x1b]0;t\\x07[/].w" in out and "• enc\\x07[bold].w" in out


# --- inspect at scale, widths ----------------------------------------------------------------------

def _many(path: Path, n: int) -> list[str]:
    """A SafeTensors file of n one-element tensors, header written directly (fast to build)."""
    names = [f"encoder.layer.{i // 16}.block.{i % 16}.weight" for i in range(n)]
    header = {name: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, name in enumerate(names)}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + np.arange(n, dtype=np.float32).tobytes())
    return names


def test_inspect_of_100k_tensors_prints_every_row_in_data_order(tmp_path: Path) -> None:
    path = tmp_path / "many.safetensors"
    names = _many(path, 100_000)
    assert set(file_names(path)) == set(names)
    out = subprocess.run([sys.executable, "-m", "migrator.cli", "inspect", str(path)], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[2])})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    rows = lines[3:3 + len(names)]
    assert [row.split()[0] for row in rows] == names
    data_start = path.stat().st_size - 4 * len(names)
    assert [int(row.split()[-1]) for row in rows[:3]] == [data_start, data_start + 4, data_start + 8]
    assert lines[3 + len(names)] == f"100,000 tensors, {human_bytes(400_000)}"
    assert all(line == line.rstrip() for line in lines)  # piped: no padding beyond the content
    assert len(lines[1]) == max(len(line) for line in lines[1:3 + len(names)])


def test_inspect_fits_columns_and_names_reassemble(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.safetensors"
    names = [f"model.decoder.layers.{i}.encoder_attention.out_projection.weight" for i in range(4)]
    save_file({n: np.zeros((3, 2), np.float16) for n in names}, str(path))
    for width in (50, 64):
        monkeypatch.setenv("COLUMNS", str(width))
        code, out, _ = run(capsys, "inspect", str(path))
        lines = out.splitlines()
        assert code == 0 and max(map(len, lines)) <= width
        top = next(i for i, line in enumerate(lines) if line.startswith("name "))  # below the (wrapped) title
        name_width = lines[top].index("dtype") - 2
        table = lines[top + 2:lines.index(f"4 tensors, {human_bytes(4 * 12)}")]
        got: list[str] = []
        for line in table:
            cell, rest = line[:name_width].rstrip(), line[name_width:].strip()
            if rest:
                got.append(cell)
            else:
                got[-1] += cell
        assert sorted(got) == sorted(file_names(path))
    monkeypatch.delenv("COLUMNS")
    _, out, _ = run(capsys, "inspect", str(path), "--limit", "1")
    assert out.splitlines()[1].index("dtype") == len(names[0]) + 2  # piped: names unwrapped
    assert "... and 3 more tensors (use --rows N or --json)" in out


# --- --help, usage, --json failures --------------------------------------------------------------

@pytest.mark.parametrize("command", ["inspect", "convert", "run", "plan", "validate", "schema"])
def test_each_command_has_help_with_two_examples(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    examples = out.split("examples:\n", 1)[1].splitlines()
    assert len([line for line in examples if line.startswith(f"  migrate {command}")]) >= 2
    _, commands = _parser()
    for action in commands[command]._actions:  # every argument says what it is
        assert action.help, (command, action.dest)
        assert action.help in " ".join(out.split()) or "%" in action.help


@pytest.mark.parametrize("argv", [["inspect", "f.bpk", "--bogus"], ["run", "r.yaml", "--frobnicate", "1"],
                                  ["plan", "r.yaml", "extra"], ["validate", "a.yaml", "--nope"]])
def test_unknown_options_print_the_subcommands_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(f"usage: migrate {argv[0]} ") and "unrecognized arguments" in err


def test_json_failures_are_one_error_object_with_the_same_exit_codes(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "s.safetensors"))
    (tmp_path / "t.bpk").write_bytes(b"exists")
    good = tmp_path / "good.yaml"
    good.write_text("version: 1\nsource: {path: s.safetensors}\ntarget: {path: t.bpk}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nsource: {path: s.safetensors}\ntarget: {path: t.bpk, colour: red}\n")
    cases = [
        (["inspect", str(tmp_path / "nope.bpk"), "--json"], 1),
        (["inspect", str(tmp_path / "s.safetensors"), "--limit", "many", "--json"], 2),
        (["inspect", str(tmp_path / "s.safetensors"), "--bogus", "--json"], 2),
        (["plan", str(bad), "--json"], 2),
        (["run", str(bad), "--json"], 2),
        (["run", str(good), "--no-progress", "--json"], 1),  # the target exists
        (["convert", str(tmp_path / "s.safetensors"), str(tmp_path / "t.bpk"), "--json"], 1),
        (["convert", str(tmp_path / "s.safetensors"), str(tmp_path / "u.bpk"), "--dtype", "F99", "--json"], 2),
    ]
    kinds = []
    for argv, want in cases:
        code, out, _ = run(capsys, *argv)
        error = json.loads(out)["error"]
        assert code == want, (argv, out)
        assert error["message"] and error["kind"], argv
        kinds.append(error["kind"])
    assert kinds[:2] == [kinds[0], "UsageError"] and kinds[3] == kinds[4] == "RecipeError"
    assert kinds[5] == kinds[6] == "TargetExistsError"
    code, out, _ = run(capsys, "plan", str(bad), "--json")
    issue = json.loads(out)["error"]["issues"][0]
    assert issue["line"] == 3 and "colour" in issue["message"] and issue["file"].endswith("bad.yaml")


def test_validate_json_is_one_document_with_a_result_per_recipe(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "s.safetensors"))
    save_file({"w": np.ones(3, np.float32)}, str(tmp_path / "tpl.safetensors"))
    (tmp_path / "ok.yaml").write_text("version: 1\nsource: {path: s.safetensors}\ntarget: {path: o.bpk}\n")
    (tmp_path / "bad.yaml").write_text("version: 1\nsource: {path: s.safetensors}\n")
    (tmp_path / "fails.yaml").write_text("version: 1\nsource: {path: s.safetensors}\n"
                                         "target: {path: o.safetensors, template: tpl.safetensors}\n")
    (tmp_path / "gone.yaml").write_text("version: 1\nsource: {path: nope.safetensors}\ntarget: {path: o.bpk}\n")
    paths = [str(tmp_path / f"{n}.yaml") for n in ("ok", "bad", "fails", "gone")]
    code, out, err = run(capsys, "validate", *paths, "--json")
    doc = json.loads(out)
    assert code == 2 and doc["exit_code"] == 2 and doc["ok"] is False
    assert [r["recipe"] for r in doc["recipes"]] == paths
    assert [r["status"] for r in doc["recipes"]] == ["ok", "invalid", "would_fail", "error"]
    assert [r["exit_code"] for r in doc["recipes"]] == [0, 2, 1, 1]
    assert doc["recipes"][0]["tensors"] == 1 and doc["recipes"][0]["target"] == str(tmp_path / "o.bpk")
    assert "shape" in " ".join(doc["recipes"][2]["errors"]).lower() or doc["recipes"][2]["errors"]
    code, out, err = run(capsys, "validate", paths[0], "--json")
    assert code == 0 and json.loads(out)["ok"] is True
    code, out, err = run(capsys, "validate", *paths)
    assert code == 2 and f"{paths[0]}: ok (1 tensor -> " in out and f"{paths[1]}: invalid" in err


def test_failing_plan_and_run_json_carry_an_error_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "s.safetensors"))
    save_file({"w": np.ones(3, np.float32)}, str(tmp_path / "tpl.safetensors"))  # shape mismatch
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nsource: {path: s.safetensors}\n"
                      "target: {path: o.safetensors, template: tpl.safetensors}\n")
    for command in ("plan", "run"):
        code, out, _ = run(capsys, command, str(recipe), "--json", *(["--no-progress"] if command == "run" else []))
        doc = json.loads(out)
        assert code == 1 and doc["errors"] and doc["error"]["kind"] == "MigrationError"
        assert doc["error"]["file"] == str(tmp_path / "o.safetensors")
    assert not (tmp_path / "o.safetensors").exists()
    (tmp_path / "ok.yaml").write_text("version: 1\nsource: {path: s.safetensors}\ntarget: {path: o.bpk}\n")
    code, out, _ = run(capsys, "plan", str(tmp_path / "ok.yaml"), "--json")
    assert code == 0 and "error" not in json.loads(out)


def test_progress_columns_use_iec_units() -> None:
    from types import SimpleNamespace

    from migrator.run.execute import progress_columns

    done, speed = progress_columns()
    task = SimpleNamespace(completed=3 * 1024**2 + 512 * 1024, total=5 * 1024**3, finished_speed=None,
                           speed=2.5 * 1024**2)
    assert str(done.render(task)) == "3.5 MiB/5.0 GiB"
    assert str(speed.render(task)) == "2.5 MiB/s"
    assert str(speed.render(SimpleNamespace(finished_speed=None, speed=None))) == "?"


def test_inspect_json_is_the_summary_exactly_one_tensor_a_line(hostile: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from migrator.analysis.inspect import inspect_file

    empty = tmp_path / "empty.safetensors"
    save_file({}, str(empty), metadata={"format": "pt"})
    for path in (hostile, empty):
        code, out, _ = run(capsys, "inspect", str(path), "--json")
        assert code == 0 and json.loads(out) == json.loads(json.dumps(inspect_file(path), default=str))
        tensor_lines = [line for line in out.splitlines() if line.startswith('    {"name": ')]
        assert len(tensor_lines) == len(file_names(path))
    code, out, _ = run(capsys, "inspect", str(empty))
    assert code == 0 and out.splitlines()[1:] == [
        "name  dtype  shape  size  offset", "----  -----  -----  ----  ------", "0 tensors, 0 B", "",
        "metadata", "key     value", "------  -----", "format  pt"]


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_inspect_into_a_closed_pipe_stops_with_sigpipe_status(tmp_path: Path, extra: list[str]) -> None:
    """`migrate inspect big | head -1`: the table and the JSON are written a chunk at a time, so the
    reader leaving is noticed (one huge write could end silently part way, exit 0)."""
    path = tmp_path / "many.safetensors"
    _many(path, 20_000)
    proc = subprocess.Popen([sys.executable, "-m", "migrator.cli", "inspect", str(path), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""

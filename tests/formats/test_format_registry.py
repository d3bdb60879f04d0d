"""Every list of formats is the registry's: the docs table, the package docstring, the recipe schema's
literals, the command line's help and checks, the detection message, and the extensions."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import migrator
import migrator.formats
from migrator.core.bytesource import MemorySource
from migrator.core.errors import UnknownFormatError
from migrator.formats import registry
from migrator.formats.detect import detect

REPO = Path(__file__).resolve().parents[2]


def test_docs_formats_table_is_the_registrys() -> None:
    page = (REPO / "docs" / "formats.md").read_text(encoding="utf-8")
    table = page.split("<!-- formats table: generated -->\n", 1)[1].split("<!-- end of the formats table -->", 1)[0]
    assert table == registry.docs_table(), "docs/formats.md: paste formats.registry.docs_table()"
    readable, written = len(registry.names(readable=True, folders=True)), len(registry.names(writable=True))
    words = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    assert f"migrator reads {words[readable]} formats and writes {words[written]}" in page


def test_the_package_docstrings_and_the_commands_description_name_every_format() -> None:
    main_help = subprocess.run([sys.executable, "-m", "migrator.cli", "--help"], capture_output=True, text=True,
                               check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "COLUMNS": "400"}).stdout
    for doc in (migrator.formats.__doc__ or "", migrator.__doc__ or "", main_help):
        for spec in registry.specs():
            assert spec.title in " ".join(doc.split()), (spec.name, doc[:200])


def test_the_recipe_schema_enums_are_the_registrys() -> None:
    schema = json.loads((REPO / "schemas" / "recipe.schema.json").read_text(encoding="utf-8"))
    enums = {tuple(v["enum"]) for v in _walk(schema) if isinstance(v, dict) and "burnpack" in v.get("enum", ())}
    assert enums == {registry.choices(writable=True), registry.choices(readable=True),
                     (*registry.choices(readable=True), "mergekit")} - {()}


def _walk(node: object) -> list[object]:
    out = [node]
    if isinstance(node, dict):
        out += [x for v in node.values() for x in _walk(v)]
    elif isinstance(node, list):
        out += [x for v in node for x in _walk(v)]
    return out


@pytest.mark.parametrize("command, option, kind", [("inspect", "--from", {"readable": True}),
                                                   ("convert", "--from", {"readable": True}),
                                                   ("convert", "--to", {"writable": True})])
def test_help_lists_every_format_an_option_takes(command: str, option: str, kind: dict[str, bool]) -> None:
    out = subprocess.run([sys.executable, "-m", "migrator.cli", command, "--help"], capture_output=True, text=True,
                         check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "COLUMNS": "400"}).stdout
    line = next(ln for ln in out.splitlines() if ln.strip().startswith(option + " "))  # --to, not --top-level-key
    listed = re.findall(r"[a-z_]+(?= \||$| \()", line.split(option, 1)[1].strip())
    assert listed == list(registry.choices(**kind)), line


def test_the_detection_message_names_each_sniffed_format() -> None:
    with pytest.raises(UnknownFormatError) as e:
        detect(MemorySource(b"\x00" * 64))
    for spec in registry.specs():
        if spec.sniffs:
            assert f"{spec.title} ({spec.recognized_by})" in str(e.value)


def test_each_extension_names_its_format_and_targets_follow_the_one_rule() -> None:
    for spec in registry.specs():
        for ext in spec.extensions:
            assert registry.by_extension(f"dir/model{ext.upper()}") == spec.name
    assert registry.target_format("out") == "burnpack"  # Burn appends .bpk
    assert registry.target_format("out/", sharded=True) == "safetensors"  # Hugging Face's folder
    assert registry.target_format("out.bin/", sharded=True) == "pytorch"
    assert registry.target_format("x.st", "gguf") == "gguf"
    with pytest.raises(UnknownFormatError, match=r"cannot tell the output format from extension '\.onnx'"):
        registry.target_format("x.onnx")
    with pytest.raises(UnknownFormatError, match="read only"):
        registry.target_format("x", "deepspeed")
    assert registry.target_format("x", "dcp") == "dcp"  # a folder format with a writer: the folder x
    with pytest.raises(UnknownFormatError, match="unknown format 'onnx'"):
        registry.target_format("x", "onnx")


def test_names_for_the_command_line() -> None:
    assert registry.names(readable=True) == ("burnpack", "safetensors", "pytorch", "gguf")
    # DCP and torch_dist: folders, named by --to
    assert registry.names(writable=True) == ("burnpack", "safetensors", "pytorch", "gguf", "dcp", "torch_dist")
    assert registry.names(readable=True, folders=True)[4:] == ("dcp", "torch_dist", "deepspeed", "trainer",
                                                               "megatron-legacy", "nemo")
    assert registry.choices(writable=True)[0] == "auto"

"""The recipe family: recipes as seeds (one using every key, one with YAML anchors, the bundled ones),
the YAML tokens and line edits they are mutated with, and how a case loads one."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from .common import REPO

RECIPE_FULL = r"""# a recipe using every key
version: 1
description: every key
source:
  path: weights/model.pt
  format: auto
  top_level_key: state_dict
  contiguous_indices: true
  skip_enum_variants: false
remap:
  - from: '^model\.'
    to: ''
  - from: '^transformer\.h\.(\d+)\.'
    to: 'transformer.layer$1.'
  - from: '^(?P<block>\w+)\.w$'
    to: '\g<block>.weight'
    syntax: python
filter:
  include: [{regex: '^encoder\.'}, {path: decoder.scale}, {predicate: 'pkg.module:func'}]
  exclude: [{regex: '\.num_batches_tracked$'}]
modules:
  Linear: ['\.(query|key|value)$']
  BatchNorm: ['\.bn\d+$']
adapters: [pytorch_to_burn, {half_precision: {with: [BatchNorm], without: [Embedding]}}, {float_cast: {to: BF16}}]
dtype: {cast: F16}
target:
  path: out/model.bpk
  format: auto
  template: init.bpk
  template_format: burnpack
  overwrite: false
  metadata: {description: my model}
  clear_metadata: false
  scalars: {epoch: {int: 42}, lr: {float: 0.001}, n: {uint: 7}, ok: {bool: true}}
allow_partial: false
validate: true
"""


RECIPE_ANCHORS = """version: 1
source: &src {path: a.safetensors, format: safetensors}
remap: [{from: 'a', to: 'b'}, {from: '(?<x>y)', to: '${x}z'}]
dtype: template
target: {<<: *src, path: b.bpk, scalars: none, template: t.bpk}
"""


def recipe_seeds() -> list[bytes]:
    out = [RECIPE_FULL.encode(), RECIPE_ANCHORS.encode(), b"version: 1\nsource: {path: a.pt}\ntarget: {path: b.bpk}\n"]
    for p in sorted((REPO / "recipes").glob("*.yaml")):
        out.append(p.read_bytes())
    return out


YAML_TOKENS = ("", "~", "null", "true", "false", "0", "-1", "1.5", "1e999", ".nan", ".inf", "18446744073709551616",
               "-9223372036854775809", "[]", "{}", "[a, b]", "{a: 1}", "'('", "'[z-a]'", "'\\p{L}'", "'(?<n>x)'",
               "'a(?i)b'", "'$1'", "'\\g<9>'", "'\\1'", "&x 1", "*x", "*nope", "!!python/object/apply:os.system ['x']",
               "!!binary aGk=", "!!set {a}", "!!timestamp 2001-01-01", "2001-01-01", "|\n  block", ">-", "'\\x00'",
               "\"\\ud800\"", "{cast: F16}", "{cast: I8}", "{cast: F8_E4M3}", "{float_cast: {to: U8}}",
               "[pytorch_to_burn, {half_precision: {without: [Foo]}}]", "{half_precision: {with: [1]}}",
               "/dev/null", "..", "x.bpk", "a.pt", "'  '", "x" * 300, "[[[[[[[[1]]]]]]]]", "{? [a]: b}",
               "{1: 2}", "{null: 1}", "{true: x}", "[*x, *x]", "<<: {a: 1}", "{regex: '^a'}", "{path: a, regex: b}",
               "{predicate: 'os:system'}", "keep", "template", "none", "auto", "burnpack", "pytorch", "rust",
               "python", "1", "2", "'1'", "0x1F", "0o17", "+1", "1_000", "1:20", "=", "? a", "- x", "\t", "\x00",
               "\ufeff", "#", "%YAML 1.1", "---", "...")


def _yaml_line(data: bytes, how: int, line: int, token: int) -> bytes:
    """Line-level recipe edits: replace a value or a key, duplicate, drop, re-indent, insert."""
    lines = data.split(b"\n")
    i = line % len(lines)
    tok = YAML_TOKENS[token % len(YAML_TOKENS)].encode("utf-8", "surrogatepass")
    text = lines[i]
    how %= 7
    if how == 0 and b":" in text:  # value
        key, _, _ = text.partition(b":")
        lines[i] = key + b": " + tok
    elif how == 1 and b":" in text:  # key
        indent = len(text) - len(text.lstrip(b" -"))
        _, _, value = text.partition(b":")
        lines[i] = text[:indent] + tok + b":" + value
    elif how == 2:
        lines.insert(i, text)
    elif how == 3:
        del lines[i]
    elif how == 4:
        lines[i] = b" " * (token % 5) + text.lstrip(b" ")
    elif how == 5:
        lines.insert(i, tok)
    else:  # a list item's value
        lines[i] = re.sub(rb"\[[^\]]*\]", lambda m: b"[" + tok + b"]", text, count=1)
    return b"\n".join(lines)


def _exercise_recipe(data: bytes, path: Path | None) -> None:
    from migrator.recipe.loader import load_recipe, parse_recipe

    if path is not None:
        path.write_bytes(data)
        loaded = load_recipe(path)
    else:
        loaded = parse_recipe(data.decode("utf-8", "replace"), base_dir=Path(tempfile.gettempdir()))
    r = loaded.recipe
    r.dump()
    _ = (loaded.source_path, loaded.target_path, loaded.template_path, loaded.warnings)

"""Hostile mergekit YAML given to `migrate merge CONFIG OUT/`: alias bombs and other YAML that
expands or fails to construct, unknown methods, weights, `t` and densities that are not numbers
(or not finite, or out of range), slices beyond the models' layers, paths that escape or do not
exist, and models whose tensors do not fit together.

Every case goes through the command line and is held to the same promises
(`hostile.refused`): exit 1 or 2, one line naming the config's line (or the model and
tensor), no traceback, no output folder or scratch file, an existing target unchanged, bounded time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from migrator import from_numpy, save
from tests.support.hostile import refused

HIDDEN, LAYERS = 8, 2


def model(folder: Path, seed: int, hidden: int = HIDDEN, layers: int = LAYERS) -> None:
    """A tiny Llama-named folder (no torch): config.json, embeddings, per-layer q_proj and norm."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    t = {"model.embed_tokens.weight": (16, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        t[f"model.layers.{i}.self_attn.q_proj.weight"] = (hidden, hidden)
        t[f"model.layers.{i}.input_layernorm.weight"] = (hidden,)
    save([from_numpy(k, rng.standard_normal(v).astype(np.float32)) for k, v in t.items()],
         folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "hidden_size": hidden, "num_hidden_layers": layers}))


def linear(weight: str = "1", other: str = "1", extra: str = "") -> str:
    return (f"merge_method: linear\nmodels:\n  - {{model: m0, parameters: {{weight: {weight}}}}}\n"
            f"  - {{model: m1, parameters: {{weight: {other}}}}}\n{extra}")


def ties(density: str) -> str:
    return (f"merge_method: ties\nbase_model: m0\nmodels:\n"
            f"  - {{model: m1, parameters: {{weight: 1, density: {density}}}}}\nparameters: {{normalize: true}}\n")


def slerp(t: str) -> str:
    return ("merge_method: slerp\nbase_model: m0\nslices:\n  - sources:\n      - {model: m0, layer_range: [0, 2]}\n"
            f"      - {{model: m1, layer_range: [0, 2]}}\nparameters: {{t: {t}}}\n")


def passthrough(*ranges: str) -> str:
    slices = "".join(f"  - sources: [{{model: m0, layer_range: {r}}}]\n" for r in ranges)
    return f"merge_method: passthrough\nslices:\n{slices}"


def laughs(levels: int, width: int = 10) -> str:
    """A billion-laughs config: each anchor lists the previous one `width` times."""
    lines = ["a0: &a0 [lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return linear(extra="\n".join(lines) + "\n")


CASES: dict[str, str | bytes] = {
    # YAML that expands or does not construct
    "alias bomb": laughs(9),
    "alias bomb in a weight": "x: &x [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
                              + "".join(f"x{i}: &x{i} [{', '.join([f'*x{i - 1}' if i > 1 else '*x'] * 10)}]\n"
                                        for i in range(1, 8))
                              + linear(weight="*x7"),
    "nested deep": linear(extra="x: " + "[" * 5000 + "]" * 5000 + "\n"),
    "not yaml": "merge_method: linear\nmodels: [\n",
    "empty": "",
    "a list": "- merge_method: linear\n",
    "a scalar": "linear\n",
    "not utf-8": b"merge_method: \xff\xfe\n",
    "python tag": "merge_method: !!python/object/apply:os.system ['true']\nmodels: [{model: m0}]\n",
    "duplicate key": linear(extra="merge_method: ties\n"),
    "integer of 5000 digits": linear(weight="1" + "0" * 5000),
    "larger than the limit": linear(extra="# " + "x" * (256 << 10) + "\n"),
    # methods and their parameters
    "unknown method": "merge_method: della_linear_plus\nmodels: [{model: m0}, {model: m1}]\n",
    "method a list": "merge_method: [linear]\nmodels: [{model: m0}, {model: m1}]\n",
    "no method": "models: [{model: m0}, {model: m1}]\n",
    "no models": "merge_method: linear\n",
    "models empty": "merge_method: linear\nmodels: []\n",
    "models a mapping": "merge_method: linear\nmodels: {model: m0}\n",
    "weight NaN": linear(weight=".nan"),
    "weight infinite": linear(weight=".inf"),
    "weight beyond float32": linear(weight="1e39"),
    "weight a string": linear(weight="heavy"),
    "weights summing to zero": linear(weight="1", other="-1"),
    "weight a list of strings": linear(weight="[a, b]"),
    "weight an empty list": linear(weight="[]"),
    "weight gradient nested": linear(weight="[[1, 2], 3]"),
    "weight filter list bad": linear(weight="[{filter: '(', value: 1}]"),
    "density negative": ties("-0.5"),
    "density above one": ties("2"),
    "density NaN": ties(".nan"),
    "density a string": ties("half"),
    "t NaN": slerp(".nan"),
    "t a string": slerp("half"),
    "t an empty list": slerp("[]"),
    "t a list of strings": slerp("[a, b]"),
    "t a list of lists": slerp("[[0, 1], [1]]"),
    "t beyond float32": slerp("-1e40"),
    # slices
    "slice past the layers": passthrough("[0, 3]"),
    "slice huge": passthrough("[0, 1000000000000]"),
    "slice beyond 64 bits": passthrough("[0, 36893488147419103232]"),
    "slice reversed": passthrough("[2, 0]"),
    "slice negative": passthrough("[-1, 2]"),
    "slice of three": passthrough("[0, 1, 2]"),
    "slice of strings": passthrough("[a, 2]"),
    "slice without sources": "merge_method: passthrough\nslices:\n  - {}\n",
    "slices many": passthrough(*["[0, 2]"] * 200_000)[:256 << 10],  # the most the size limit lets in
    "slices and models": passthrough("[0, 2]") + "models: [{model: m0}]\n",
    # paths
    "model missing": "merge_method: linear\nmodels: [{model: ./nowhere}, {model: m1}]\n",
    "model escaping": "merge_method: linear\nmodels: [{model: ../../../../../../../../nonexistent}, {model: m1}]\n",
    "model absolute": "merge_method: linear\nmodels: [{model: /nonexistent/model}, {model: m1}]\n",
    "model a file": "merge_method: linear\nmodels: [{model: m0/config.json}, {model: m1}]\n",
    "model empty path": "merge_method: linear\nmodels: [{model: ''}, {model: m1}]\n",
    "model a hub id": "merge_method: linear\nmodels: [{model: org/name}, {model: m1}]\n",
    "model a number": "merge_method: linear\nmodels: [{model: 7}, {model: m1}]\n",
    "model with a NUL": 'merge_method: linear\nmodels: [{model: "m0\\0"}, {model: m1}]\n',
    "model given twice": "merge_method: linear\nmodels: [{model: m0}, {model: m0}]\n",
    "lora missing": "merge_method: linear\nmodels: [{model: m0+nolora}, {model: m1}]\n",
    "base_model missing": "merge_method: ties\nbase_model: gone\nmodels: [{model: m1, parameters: {weight: 1}}]\n",
    "tokenizer_source escaping": linear(extra="tokenizer_source: ../../../../../../etc\n"),
    "models of other shapes": "merge_method: linear\nmodels: [{model: m0}, {model: wide}]\nparameters: {weight: 1}\n",
    "slices empty": "merge_method: passthrough\nslices: []\n",
    "slice sources empty": "merge_method: passthrough\nslices:\n  - sources: []\n",
    "dtype int8": linear(extra="dtype: int8\n"),
    "out_dtype a list": linear(extra="out_dtype: [float16]\n"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mk")
    model(root / "m0", 0)
    model(root / "m1", 1)
    model(root / "wide", 2, hidden=HIDDEN * 2)
    model(root / "deep", 3, layers=4)
    return root


def _setup(models: Path, tmp_path: Path, text: str | bytes) -> Path:
    work = tmp_path / "w"
    work.mkdir()
    for name in ("m0", "m1", "wide", "deep"):
        (work / name).symlink_to(models / name)
    config = work / "cfg.yml"
    config.write_bytes(text.encode() if isinstance(text, str) else text)
    return config


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_mergekit_config_is_refused_cleanly(models: Path, tmp_path: Path, name: str) -> None:
    config = _setup(models, tmp_path, CASES[name])
    done = refused(["merge", str(config), str(tmp_path / "w" / "out")], tmp_path)
    assert "cfg.yml" in done.stderr or str(tmp_path) in done.stderr, done.stderr  # names the config or a model


@pytest.mark.parametrize("name", ["alias bomb", "weights summing to zero", "models of other shapes"])
def test_an_existing_target_survives(models: Path, tmp_path: Path, name: str) -> None:
    config = _setup(models, tmp_path, CASES[name])
    out = tmp_path / "w" / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the old merge")
    refused(["merge", str(config), str(out), "--overwrite"], tmp_path)


def test_the_good_config_merges(models: Path, tmp_path: Path) -> None:
    """The corpus's models are sound: each refusal above is the config's."""
    from tests.support.cli import migrate_in_process

    config = _setup(models, tmp_path, linear())
    done = migrate_in_process("merge", str(config), str(tmp_path / "w" / "out"))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_config_that_is_not_a_file_is_refused_unread(models: Path, tmp_path: Path, kind: str) -> None:
    """A FIFO would block the read forever, /dev/zero never end: refused before reading."""
    import os

    work = tmp_path / "w"
    work.mkdir()
    config = work / "cfg.yml"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "folder":
        config.mkdir()
    args = ["merge", "/dev/zero" if kind == "device" else str(config), str(work / "out")]
    refused(args, tmp_path, words="not a regular file" if kind != "folder" else "")

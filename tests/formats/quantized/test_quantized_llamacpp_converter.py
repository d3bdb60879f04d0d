"""Fine-grained FP8 -> GGUF equals llama.cpp's own converter on the same folder, bit for bit.

Oracle: `convert_hf_to_gguf.py` of the llama-cpp-python 0.3.36 sdist (extracted by `make test`, as for
test_gguf_lora.py) run on a tiny Llama whose linear weights are fine-grained FP8 (`quant_method: fp8`,
48x48 `weight_block_size`, edge blocks cropped, `weight_scale_inv` per block). That converter dequantizes
FP8 in F32 (`conversion/base.py` `dequant_simple`: `weight.float() * scale.float()`, the block scale
repeated over its block and cropped) before its usual type rules, as migrator does, so no tolerance is
needed: for `--outtype f32`, `f16` and `q8_0` against `migrate convert --dtype F32` (plus `--quantize F16`
/ `Q8_0`, which keep 1-D tensors and norms F32 as the converter does) every tensor's name, type, shape
and bytes are equal. Not compared: the order of tensors in the file (within a shard the converter
writes them in the shard's sorted order, migrator writes the plain tensors before the dequantized ones;
llama.cpp looks tensors up by name), and key/values (the tokenizer and the converter's metadata
heuristics are its own). A sentencepiece tokenizer.model is trained in the test only because the
converter refuses a folder without one.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import migrate_in_process
from tests.support.quantized import fp8_folder

pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
spm = pytest.importorskip("sentencepiece")

pytestmark = pytest.mark.slow

SCRIPTS = Path(sys.prefix) / "llamacpp-scripts-0.3.36"
SCRIPT = SCRIPTS / "convert_hf_to_gguf.py"
# llama.cpp's --outtype -> migrator's options giving the same types
OUTTYPES = {"f32": ["--dtype", "F32"], "f16": ["--dtype", "F32", "--quantize", "F16"],
            "q8_0": ["--dtype", "F32", "--quantize", "Q8_0"]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The FP8 folder, with the `architectures` and tokenizer the converter requires."""
    if not SCRIPT.is_file():
        pytest.skip(f"llama.cpp's scripts are extracted by `make test` into {SCRIPTS}")
    root = tmp_path_factory.mktemp("fp8-llamacpp")
    # rows of 64 and 96 columns (Q8_0 needs multiples of 32, else both fall back to F16), cut by 48x48
    # blocks so the edge blocks are cropped
    src, stored = fp8_folder(root / "fp8", block=(48, 48), hidden=64, intermediate=96)
    assert sum(n.endswith("weight_scale_inv") for n in stored) == 14
    config = json.loads((src / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (src / "config.json").write_text(json.dumps(config, indent=2))
    rng = random.Random(0)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(" ".join("".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 6)))
                                         for _ in range(10)) for _ in range(500)))
    # vocab_size 64 is the model's; no byte fallback, which alone would need 256 pieces
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(src / "tokenizer"), vocab_size=64,
                                   model_type="bpe", character_coverage=1.0, minloglevel=2)
    (src / "tokenizer.vocab").unlink()
    return src


@pytest.mark.parametrize("outtype", list(OUTTYPES))
def test_fp8_to_gguf_equals_llamacpp_converter(folder: Path, tmp_path: Path, outtype: str) -> None:
    theirs, ours = tmp_path / "llamacpp.gguf", tmp_path / "migrator.gguf"
    done = subprocess.run([sys.executable, str(SCRIPT), str(folder), "--outfile", str(theirs), "--outtype", outtype],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    p = migrate_in_process("convert", str(folder), str(ours), *OUTTYPES[outtype])
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout + p.stderr
    want = {t.name: t for t in gguf.GGUFReader(str(theirs)).tensors}
    got = {t.name: t for t in gguf.GGUFReader(str(ours)).tensors}
    assert sorted(got) == sorted(want) and len(want) == 21
    linear_type = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0"}[outtype]
    assert {t.tensor_type.name for n, t in want.items() if n.startswith("blk.") and "norm" not in n} == {linear_type}
    for name, a in want.items():
        b = got[name]
        assert b.tensor_type == a.tensor_type, a.name
        assert list(b.shape) == list(a.shape), a.name
        assert np.asarray(b.data).tobytes() == np.asarray(a.data).tobytes(), a.name

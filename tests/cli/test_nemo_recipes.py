"""The shipped Megatron -> Hugging Face recipe, run unchanged on a NeMo 2 checkpoint folder.

`tests/support/nemo.py` has megatron-core write the tensors NeMo saves (`module.`-prefixed, GQA,
tensor-parallel over 2 gloo ranks) with the context NeMo writes beside them, and run megatron's own
forward on CPU. `migrate run recipes/megatron-llama-to-hf.yaml --source NEMO_DIR --target OUT/` makes
the Hugging Face folder, its config.json from `context/model.yaml` (`target.hf_config`), and
transformers' logits on it must equal megatron's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.nemo import cached_nemo_checkpoint
from tests.support.torch_dist import FFN, GROUPS, HEADS, HIDDEN, LAYERS, PADDED, SEQ, TOKENS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow  # megatron-core writing on 2 ranks, once per session and layout

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("tied", [False, True])
def test_the_llama_recipe_gives_megatrons_logits(tied: bool, tmp_path_factory: pytest.TempPathFactory,
                                                 tmp_path: Path) -> None:
    folder, oracle = cached_nemo_checkpoint(tmp_path_factory, tied=tied)
    out = tmp_path / "hf"
    done = migrate_in_process("run", str(REPO / "recipes" / "megatron-llama-to-hf.yaml"), "--source", str(folder),
                              "--target", f"{out}/", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "read without the 'module.' prefix" in done.stdout + done.stderr  # the renaming is said
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is tied
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"],
            config["max_position_embeddings"], config["rms_norm_eps"], config["torch_dtype"]) == (
        HIDDEN, LAYERS, HEADS, GROUPS, FFN, PADDED, SEQ, 1e-5, "float32")
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor(TOKENS)).logits
    torch.testing.assert_close(logits, oracle["logits"], rtol=1e-5, atol=1e-4)
    # a control: k and v of one group swapped no longer match
    sd = model.state_dict()
    k, v = sd["model.layers.1.self_attn.k_proj.weight"], sd["model.layers.1.self_attn.v_proj.weight"]
    k[:HIDDEN // HEADS], v[:HIDDEN // HEADS] = v[:HIDDEN // HEADS].clone(), k[:HIDDEN // HEADS].clone()
    with torch.no_grad():
        changed = model(torch.tensor(TOKENS)).logits
    assert not torch.allclose(changed, oracle["logits"], atol=1e-3)


DOC = REPO / "docs" / "training-checkpoints.md"


def _blocks() -> dict[str, str]:
    import re

    text = DOC.read_text(encoding="utf-8")
    found = dict(re.findall(r"<!-- tested: (nemo-[\w-]+) -->\n```(?:sh)?\n(.*?)```", text, flags=re.S))
    assert set(found) == {"nemo-layout", "nemo-commands"}, sorted(found)
    return found


def test_the_docs_layout_and_commands(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/training-checkpoints.md's NeMo 2 section: the folder it draws is the one the tests write, and
    its commands run as written on it."""
    import shlex
    import shutil

    folder, oracle = cached_nemo_checkpoint(tmp_path_factory)
    found = _blocks()
    drawn = [line.split("#")[0].strip() for line in found["nemo-layout"].splitlines()[1:]]
    for name in filter(None, drawn):
        where = next(folder.rglob(name.rstrip("/")), None)
        assert where is not None and where.is_dir() == name.endswith("/"), name
    shutil.copytree(folder, tmp_path / "nemo-ckpt")
    shutil.copytree(REPO / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("*.py", "mergekit"))
    monkeypatch.chdir(tmp_path)
    for line in found["nemo-commands"].strip().splitlines():
        args = shlex.split(line, comments=True)
        if args[0] == "cp":  # through the shell, for its glob
            subprocess.run(line.split("#")[0], shell=True, check=True)
            continue
        assert args[0] == "migrate"
        done = migrate_in_process(*args[1:])
        assert done.returncode == 0, (line, done.stderr)
    from safetensors.torch import load_file

    flat = load_file(tmp_path / "megatron.safetensors")
    assert torch.equal(flat["decoder.layers.1.mlp.linear_fc1.weight"],
                       oracle["plain"]["module.decoder.layers.mlp.linear_fc1.weight"][1])
    hf = tmp_path / "hf"
    assert json.loads((hf / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
    assert tokenizer("w5 w7")["input_ids"] == [8, 10]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (hf / name).read_bytes() == (folder / "context" / "nemo_tokenizer" / name).read_bytes()


def test_the_docs_name_table_is_the_readers() -> None:
    """The page's table of NeMo names -> Megatron-LM names is `formats.nemo.config`'s RENAMED and NEGATED."""
    from migrator.formats.nemo.config import NEGATED, RENAMED

    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n### NeMo 2 checkpoints\n", 1)[1].split("\n## ", 1)[0]
    import re

    rows = re.findall(r"^\s*\| `(\w+)` \| `(\w+)`( \(its opposite\))? \|$", section, flags=re.M)
    assert {(a, b) for a, b, neg in rows if not neg} == set(RENAMED.items())
    assert {(a, b) for a, b, neg in rows if neg} == set(NEGATED.items())

"""The commands and the recipe of docs/training-checkpoints.md's "Legacy Megatron-LM checkpoints", run as
written: each block marked `<!-- tested: megatron-legacy-... -->` runs in a folder holding `ckpt/`, a
TP=2 x PP=2 legacy checkpoint of a tiny Hugging Face Llama (`tests/support/megatron_legacy.py`), and
`hf-config/` (its config.json). The oracle is transformers: the `hf/` folder the page's recipe writes
loads in LlamaForCausalLM with logits equal to the original model's.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import tests.support.megatron_legacy as mls  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "training-checkpoints.md"


def blocks() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    found = dict(re.findall(r"<!-- tested: (megatron-legacy-[\w-]+) -->\n```(?:sh|yaml)\n(.*?)```", text, flags=re.S))
    assert set(found) == {"megatron-legacy-read", "megatron-legacy-recipe", "megatron-legacy-run"}, sorted(found)
    return found


def run_block(block: str) -> None:
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == "migrate", line
        done = migrate_in_process(*words[1:])
        assert done.returncode == 0, (line, done.stdout, done.stderr)


def test_the_pages_commands_and_recipe_make_the_original_model(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import LlamaForCausalLM

    model = mls.tiny_llama()
    mls.write_legacy(tmp_path / "ckpt", mls.llama_to_mcore(model), 2, 2)
    model.config.save_pretrained(tmp_path / "hf-config")
    monkeypatch.chdir(tmp_path)
    found = blocks()
    run_block(found["megatron-legacy-read"])
    assert (tmp_path / "megatron.safetensors").is_file() and (tmp_path / "megatron-10.safetensors").is_file()
    (tmp_path / "megatron-to-hf.yaml").write_text(found["megatron-legacy-recipe"], encoding="utf-8")
    run_block(found["megatron-legacy-run"])
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, mls.VOCAB, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)

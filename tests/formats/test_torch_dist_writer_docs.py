"""docs/training-checkpoints.md, "Writing Megatron checkpoints": every block of the section run as the
page shows it.

The shell lines run `migrate` in a folder holding `llama/` (a tiny transformers Llama, grouped-query
attention), `qwen2/`, `qwen3/`, `mixtral/`, `qwen3-moe/` (`tests/support/hf_families.py`) and `recipes/`
(the repository's); the Python block runs in megatron-core 0.16.1's own process with `model`, the
GPTModel megatron builds for each model's config (`tests/support/megatron_load.py`), in the folder the
shell lines wrote into (for the other families, with their folder's name). Oracles: megatron's forward
after that block gives the logits transformers gives; the last block's folder (the Llama back from
Megatron with the checkpoint's own arguments), loaded by transformers, gives them too.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.hf_families import FAMILIES, tiny_model
from tests.support.megatron_load import TOKENS, load_into_megatron

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

pytestmark = pytest.mark.slow  # megatron-core imported in a new process: ~25 s under load

REPO = Path(__file__).resolve().parents[2]
TITLE = "## Writing Megatron checkpoints\n"


def _blocks() -> list[tuple[str, str]]:
    doc = (REPO / "docs" / "training-checkpoints.md").read_text()
    start = doc.index(TITLE)
    end = doc.find("\n## ", start + 1)
    return re.findall(r"```(\w+)\n(.*?)```", doc[start:end if end >= 0 else None], re.S)


def test_the_sections_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _blocks()
    assert [kind for kind, _ in blocks] == ["sh", "sh", "python", "sh"]
    code = blocks[2][1]
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64, tie_word_embeddings=False)
    llama = transformers.LlamaForCausalLM(config).eval()
    llama.save_pretrained(tmp_path / "llama")
    models = {"llama": llama, **{family: tiny_model(family, tmp_path / family) for family in FAMILIES}}
    shutil.copytree(REPO / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.chdir(tmp_path)
    _run(blocks[0][1] + blocks[1][1])
    assert '"llama-megatron"' in code
    for name, model in models.items():
        read = load_into_megatron(tmp_path / f"{name}-megatron", tmp_path / name / "config.json",
                                  tmp_path / f"{name}-read.pt", code=code.replace("llama-megatron", f"{name}-megatron"))
        with torch.no_grad():
            expected = model(torch.tensor(TOKENS)).logits
        torch.testing.assert_close(read["logits"], expected, rtol=1e-5, atol=1e-5, msg=name)
    _run(blocks[3][1])  # back to Hugging Face with the checkpoint's own arguments
    again = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "llama-again").eval()
    with torch.no_grad():
        assert torch.equal(again(torch.tensor(TOKENS)).logits, llama(torch.tensor(TOKENS)).logits)


def _run(block: str) -> None:
    for line in block.strip().splitlines():
        args = shlex.split(line, comments=True)
        assert args[0] == "migrate"
        done = migrate_in_process(*args[1:])
        assert done.returncode == 0, (line, done.stderr)

"""docs/training-checkpoints.md, "Writing DCP": every block of the section run as the page shows it.

The shell lines run `migrate` in a folder holding `llama/` (a tiny transformers Llama) and `ckpt/` (a
model trained one Adam step, `dcp.save`d as `get_state_dict` lays it out), the YAML block is
`surgery.yaml`, and the Python block resumes the new model. Oracles: torch's `dcp.load` reading the
converted Llama (the source's tensors), and the resumed model and optimizer holding the old ones' cut
by the recipe's rename and split in torch.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.dcp_write import new_model, old_model

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
transformers = pytest.importorskip("transformers")
st_torch = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[2]
TITLE = "## Writing DCP: back into training\n"


def _blocks() -> list[tuple[str, str]]:
    doc = (REPO / "docs" / "training-checkpoints.md").read_text()
    start = doc.index(TITLE)
    end = doc.find("\n## ", start + 1)
    return re.findall(r"```(\w+)\n(.*?)```", doc[start:end if end >= 0 else None], re.S)


def _cut(sd: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, t in sd.items():
        if name.startswith("qkv."):
            for part, piece in zip("qkv", torch.chunk(t, 3, 0), strict=True):
                out[f"{part}.{name[4:]}"] = piece
        else:
            out[name.replace("fc1.", "inp.")] = t
    return out


def test_the_sections_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    blocks = _blocks()
    assert [kind for kind, _ in blocks] == ["sh", "yaml", "python"]
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    old = old_model()
    opt = torch.optim.Adam(old.parameters(), lr=1e-2)
    for p in old.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    msd, osd = get_state_dict(old, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    (tmp_path / "surgery.yaml").write_text(blocks[1][1])
    monkeypatch.chdir(tmp_path)
    for line in blocks[0][1].strip().splitlines():
        args = shlex.split(line, comments=True)
        assert args[0] == "migrate"
        done = migrate_in_process(*args[1:])
        assert done.returncode == 0, (line, done.stderr)
    source = st_torch.load_file(str(tmp_path / "llama" / "model.safetensors"))
    into = {k: torch.zeros_like(v) for k, v in source.items()}
    dcp.load(into, checkpoint_id=str(tmp_path / "llama-dcp"), no_dist=True)
    assert all(torch.equal(into[k], v) for k, v in source.items())

    model = new_model()
    scope: dict[str, Any] = {"torch": torch, "model": model}
    exec(blocks[2][1], scope)
    for k, v in _cut(dict(msd)).items():
        assert torch.equal(model.state_dict()[k], v), k
    state = {n: scope["opt"].state[p] for n, p in model.named_parameters()}
    for key in ("exp_avg", "exp_avg_sq"):
        for k, v in _cut({n: s[key] for n, s in osd["state"].items()}).items():
            assert torch.equal(state[k][key], v), (k, key)
    assert all(float(s["step"]) == 1.0 for s in state.values())

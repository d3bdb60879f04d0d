"""Issue 20 item 1c: GPT-2's Conv1D, end to end against a real transformers GPT2LMHeadModel.

transformers' `Conv1D` (`c_attn`, `c_proj`, `c_fc`) stores its weight `[in, out]` and computes
`x @ W + b`: already Burn's Linear layout, so `pytorch_to_burn` must keep it as stored. Declaring it a
Linear (what an earlier hint suggested) transposes it wrongly, and no shape rule can catch that for the
square `attn.c_proj`. So the hints suggest only `Conv1D`, and the oracle is each torch module's forward.
"""

from __future__ import annotations

import contextlib
import gc
import io
import re
from pathlib import Path

import numpy as np
import pytest

from migrator import open_file
from migrator.naming import compile_regex
from migrator.transform.modules import module_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HINT = re.compile(r"Adapter error for '([^']+)'.*?modules: \{(\w+): \['((?:[^']|'')*)'\]\}")


def migrate(*args: str) -> tuple[int, str]:
    """The CLI in process (stdout + stderr), keeping the collector settings main() tunes."""
    from migrator.cli import main

    out, threshold = io.StringIO(), gc.get_threshold()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(list(args))
    finally:
        gc.set_threshold(*threshold)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def recipe(path: Path, src: Path, dst: Path, adapter: str, modules: dict[str, list[str]]) -> Path:
    body = "\n".join(f"  {t}: [{', '.join(chr(39) + r.replace(chr(39), 2 * chr(39)) + chr(39) for r in rxs)}]"
                     for t, rxs in modules.items())
    path.write_text(f"version: 1\nsource: {{path: '{src}'}}\ntarget: {{path: '{dst}'}}\n"
                    f"adapters: [{adapter}]\nmodules:\n{body}\n")
    return path


def test_gpt2_through_pytorch_to_burn_and_back(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    sd = gpt2.state_dict()
    src = tmp_path / "gpt2.pt"
    torch.save(sd, src)

    # 1. no declarations: c_attn, c_fc and mlp.c_proj (bias of dim 1 in a PyTorch file) are inferred
    # Conv1D; only the square attn.c_proj is refused, with one declaration covering every layer
    code, text = migrate("convert", str(src), str(tmp_path / "x.bpk"), "--adapter", "pytorch_to_burn")
    assert code == 1
    refused = sorted(set(re.findall(r"Adapter error for '([^']+)'", text)))
    assert refused == ["transformer.h.0.attn.c_proj.weight", "transformer.h.1.attn.c_proj.weight"]
    summary = re.findall(r"at once: --modules '(\w+)=([^']*)'", text)
    assert len(summary) == 1 and summary[0][0] == "Conv1D"
    rx = summary[0][1]
    paths = {module_path(n) for n in sd}
    assert sorted(p for p in paths if compile_regex(rx).search(p)) == sorted(module_path(n) for n in refused)
    # the inferred ones say so in the plan
    code, text = migrate("plan", str(recipe(tmp_path / "p.yaml", src, tmp_path / "p.bpk", "pytorch_to_burn",
                                            {"Conv1D": [rx]})))
    assert code == 0, text

    # 2. the hint pasted: Burn's layout, checked against each torch module's own forward
    declared = {"Conv1D": [rx]}
    bpk = tmp_path / "gpt2.bpk"
    code, text = migrate("run", str(recipe(tmp_path / "to_burn.yaml", src, bpk, "pytorch_to_burn", declared)))
    assert code == 0, text
    with open_file(bpk) as r:
        burn = {t.name: torch.tensor(t.numpy()) for t in r.tensors}
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))
    modules = dict(gpt2.named_modules())
    for name, module in modules.items():
        if isinstance(module, transformers.pytorch_utils.Conv1D):
            w, b = burn[f"{name}.weight"], burn[f"{name}.bias"]
            inp = x if w.shape[0] == 32 else torch.randn(3, w.shape[0], generator=torch.Generator().manual_seed(2))
            with torch.no_grad():
                assert torch.allclose(inp @ w + b, module(inp), atol=1e-6), name
        elif isinstance(module, torch.nn.Linear):  # lm_head: Burn [in, out], x @ W + b == F.linear(x, W_torch)
            with torch.no_grad():
                assert torch.allclose(x @ burn[f"{name}.weight"],
                                      torch.nn.functional.linear(x, module.weight, module.bias), atol=1e-6)
        elif isinstance(module, torch.nn.LayerNorm):
            assert torch.equal(burn[f"{name}.gamma"], module.weight) and torch.equal(burn[f"{name}.beta"], module.bias)
            assert f"{name}.weight" not in burn and f"{name}.bias" not in burn
        elif isinstance(module, torch.nn.Embedding):
            assert torch.equal(burn[f"{name}.weight"], module.weight)
    assert len(burn) == len(sd)

    # 3. back with burn_to_pytorch: bit-identical to the original state dict. A burnpack cannot show a
    # Conv1D (Burn's Linear is [in, out] too): every Conv1D is declared
    back = tmp_path / "back.pt"
    declared = {"Conv1D": [r"\.c_(attn|fc|proj)$"]}
    code, text = migrate("run", str(recipe(tmp_path / "to_torch.yaml", bpk, back, "burn_to_pytorch", declared)))
    assert code == 0, text
    restored = torch.load(back, weights_only=True)
    assert list(restored) == list(sd)
    for k, v in sd.items():
        assert restored[k].dtype == v.dtype and restored[k].shape == v.shape, k
        assert np.array_equal(restored[k].numpy().view(np.uint8), v.numpy().view(np.uint8)), k


def test_declaring_conv1d_a_linear_is_refused_where_the_bias_shows_it(gpt2: torch.nn.Module, tmp_path: Path) -> None:
    src = tmp_path / "gpt2.pt"
    torch.save(gpt2.state_dict(), src)
    code, text = migrate("run", str(recipe(tmp_path / "r.yaml", src, tmp_path / "o.bpk", "pytorch_to_burn",
                                           {"Linear": [r"\.c_(attn|fc)$"]})))
    assert code == 1 and not (tmp_path / "o.bpk").exists()
    assert "already looks [in, out]" in text
    assert "modules: {Conv1D: ['^transformer\\.h\\.0\\.attn\\.c_attn$']} (kept as stored)" in text

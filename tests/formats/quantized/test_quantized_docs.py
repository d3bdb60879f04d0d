"""Every code block of docs/quantized-checkpoints.md, run as written in a folder holding the models it
names (`fp8-model`: a tiny FP8 Llama; `adapter`: a PEFT LoRA adapter for it; `int4-model`, `gpt-oss-model`,
`mlx-model`: tiny pack-quantized, MXFP4 and MLX folders): each `migrate` line of
the sh blocks succeeds, in order, the text block is what `inspect` prints, and the python block runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.quantized import fp8_folder, tiny_llama
from tests.support.quantized_more import mlx_folder, mxfp4_folder, pack_folder

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

DOC = Path(__file__).resolve().parents[3] / "docs" / "quantized-checkpoints.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_pages_code_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fp8_folder(Path("fp8-model"), hidden=64, intermediate=128)
    pack_folder(Path("int4-model"))
    mxfp4_folder(Path("gpt-oss-model"))
    mlx_folder(Path("mlx-model"))
    config, _ = tiny_llama(0, hidden=64, intermediate=128)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{k: v for k, v in config.items()
                                                                       if k != "torch_dtype"}))
    peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained("adapter")
    outputs = []
    sh = blocks("sh")
    assert len(sh) >= 4
    for block in sh:
        for line in block.splitlines():
            if not line.strip():
                continue
            args = shlex.split(line)
            assert args[0] == "migrate", line
            p = migrate_in_process(*args[1:])
            assert p.returncode == 0 and "Traceback" not in p.stderr, (line, p.stdout, p.stderr)
            outputs.append(p.stdout)
    (text,) = blocks("text")
    for line in text.strip().splitlines():
        assert line in outputs[0], line
    (code,) = blocks("python")
    exec(compile(code, str(DOC), "exec"), {})

"""The config.json a folder target copies, kept in step with the tensors: `target.config` entries set
(null removes one) and the keys the tensors determine derived; an edit the tensors contradict is refused
in one line with nothing written. The tensors and the config are written here by safetensors and json
(the config as transformers saves a tied Llama's: no lm_head.weight stored)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    st.save_file({"model.embed_tokens.weight": torch.randn(10, 4, generator=g),
                  "model.norm.weight": torch.ones(4)}, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 10, "hidden_size": 4,
                                                    "tie_word_embeddings": True, "pad_token_id": 0}))
    return folder


def _run(tmp_path: Path, body: str) -> object:
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: model/}\n" + textwrap.dedent(body),
                                     encoding="utf-8")
    return migrate_in_process("run", str(tmp_path / "r.yaml"), "--no-progress")


def _refused(tmp_path: Path, body: str, words: str) -> None:
    p = _run(tmp_path, body)
    assert p.returncode == 1, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and words in errors[0], p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "out").exists()


def test_edits_are_set_and_null_removes_a_key(tmp_path: Path, model: Path) -> None:
    p = _run(tmp_path, """\
        ops:
          - gather: {from: 'model\\.embed_tokens\\.weight', range: [0, 8]}
        target: {path: out/, copy: [config.json], config: {pad_token_id: null, torch_dtype: float32, vocab_size: 8}}
    """)
    assert p.returncode == 0, p.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["vocab_size"] == 8 and config["torch_dtype"] == "float32" and "pad_token_id" not in config
    assert config["tie_word_embeddings"] is True


def test_derived_keys_follow_the_tensors(tmp_path: Path, model: Path) -> None:
    p = _run(tmp_path, """\
        ops:
          - add_rows: {from: 'model\\.embed_tokens\\.weight', count: 2}
          - clone: {from: 'model\\.embed_tokens\\.weight', to: 'lm_head.weight'}
        target: {path: out/, copy: [config.json]}
    """)
    assert p.returncode == 0, p.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["vocab_size"] == 12 and config["tie_word_embeddings"] is False
    assert "config.json: vocab_size 10 -> 12" in p.stdout
    assert "config.json: tie_word_embeddings True -> False" in p.stdout


@pytest.mark.parametrize(("config", "words"), [
    ("{vocab_size: 11}", "target.config: vocab_size: 11 contradicts the tensors: 'model.embed_tokens.weight' has 10 "
                         "rows"),
    ("{tie_word_embeddings: false}", "target.config: tie_word_embeddings: false contradicts the tensors: no head "
                                     "tensor is written beside 'model.embed_tokens.weight'"),
])
def test_an_edit_the_tensors_contradict_is_refused(tmp_path: Path, model: Path, config: str, words: str) -> None:
    _refused(tmp_path, f"target: {{path: out/, copy: [config.json], config: {config}}}\n", words)


def test_config_edits_need_a_copied_config(tmp_path: Path, model: Path) -> None:
    _refused(tmp_path, "target: {path: out/, config: {vocab_size: 10}}\n",
             "target.config edits the config.json copied into the folder target, and none is")
    p = _run(tmp_path, "target: {path: out.safetensors, config: {vocab_size: 10}}\n")
    assert p.returncode == 1 and "target.config edits the config.json of a folder target" in p.stderr
    assert not (tmp_path / "out.safetensors").exists()

"""A Hugging Face folder's config.json as the HF -> GGUF conversion reads it.

A config with no `architectures` (what `LlamaConfig().save_pretrained()` writes) is converted by its
`model_type`: gguf-py reads llama.cpp's names and `llama.*` key/values, and transformers' GGUF loader
gives back every parameter of the original model (so q and k were permuted). A config the conversion
cannot use is refused in one line naming config.json and the key, never with a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process
from tests.support.hostile import refused
from tests.support.models import tiny_llama_rope

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def no_architectures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama folder whose config.json names no architectures, as transformers' config alone writes it."""
    folder = tmp_path_factory.mktemp("noarch") / "hf"
    tiny_llama_rope(vocab_size=64).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_config_without_architectures_is_what_transformers_writes(tmp_path: Path) -> None:
    transformers.LlamaConfig().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "architectures" not in config and config["model_type"] == "llama"


def test_model_type_names_the_architecture(no_architectures: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    res = migrate_in_process("convert", str(no_architectures), str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    reader = gguf.GGUFReader(str(out))
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_gate.weight", "output.weight"} <= names
    assert not any(n.startswith("model.") for n in names)
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
    heads = reader.fields["llama.attention.head_count_kv"]
    assert int(heads.parts[heads.data[0]][0]) == 2
    # transformers un-permutes q/k on load: equal parameters mean they were permuted as llama.cpp expects
    original = transformers.LlamaForCausalLM.from_pretrained(no_architectures)
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path, gguf_file=out.name)
    a, b = original.state_dict(), back.state_dict()
    assert set(a) == set(b) and [k for k in a if not torch.equal(a[k], b[k])] == []


def _broken(folder: Path, tmp_path: Path, change: dict[str, object] | None = None, *, text: str | None = None,
            drop: str | None = None) -> Path:
    out = tmp_path / "hf"
    out.mkdir()
    for f in folder.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config.update(change or {})
    if drop is not None:
        del config[drop]
    (out / "config.json").write_text(text if text is not None else json.dumps(config))
    return out


@pytest.mark.parametrize(("change", "drop", "key"), [
    (None, "num_attention_heads", "num_attention_heads is missing"),
    ({"num_attention_heads": 0}, None, "num_attention_heads must be a positive integer, not 0"),
    ({"num_attention_heads": "4"}, None, 'num_attention_heads must be a positive integer, not "4"'),
    ({"num_attention_heads": True}, None, "num_attention_heads must be a positive integer, not true"),
    ({"hidden_size": -64}, None, "hidden_size must be a positive integer"),
    ({"num_key_value_heads": 3}, None, "num_key_value_heads (3) does not divide num_attention_heads (4)"),
    ({"head_dim": 0.5}, None, "head_dim must be a positive integer"),
    ({"rms_norm_eps": "tiny"}, None, "rms_norm_eps must be a positive number"),
    ({"rope_scaling": "llama3"}, None, "rope_scaling must be an object"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, None, "rope_scaling.factor must be a number"),
    ({"architectures": None}, "vocab_size", "vocab_size is missing"),  # found by model_type, checked alike
])
def test_config_refused_in_one_line_naming_the_key(no_architectures: Path, tmp_path: Path,
                                                   change: dict[str, object] | None, drop: str | None,
                                                   key: str) -> None:
    """Each of these raised KeyError, ZeroDivisionError, TypeError or ValueError out of the conversion."""
    folder = _broken(no_architectures, tmp_path, change, drop=drop)
    done = refused(["convert", str(folder), str(tmp_path / "out.gguf")], tmp_path, words="config.json", codes=(1,))
    assert key in done.stderr


def test_deeply_nested_config_is_refused(no_architectures: Path, tmp_path: Path) -> None:
    """100,000 nested arrays: Python's json raises RecursionError on it."""
    config = json.loads((no_architectures / "config.json").read_text())
    text = json.dumps(config)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(RecursionError):
        json.loads(text)
    folder = _broken(no_architectures, tmp_path, text=text)
    done = refused(["convert", str(folder), str(tmp_path / "out.gguf")], tmp_path, words="config.json", codes=(1,))
    assert "not JSON" in done.stderr


def test_transformers_reads_the_checked_keys_as_integers(no_architectures: Path) -> None:
    """The keys checked as positive integers are those transformers' LlamaConfig holds as integers."""
    config = transformers.AutoConfig.from_pretrained(no_architectures)
    for key in ("num_attention_heads", "hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size",
                "num_key_value_heads", "max_position_embeddings"):
        assert isinstance(getattr(config, key), int) and getattr(config, key) > 0, key

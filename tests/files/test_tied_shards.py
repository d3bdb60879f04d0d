"""Tied tensors in sharded outputs: grouped as huggingface_hub's split_torch_state_dict_into_shards
groups tensors sharing a storage, checked against it on a real tied model (GPT-2's lm_head/wte)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
hf_serialization = pytest.importorskip("huggingface_hub.serialization")


def migrate(*args: str) -> int:
    return migrate_in_process(*args).returncode


@pytest.fixture(scope="module")
def gpt2() -> object:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=300, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                     tie_word_embeddings=True)
    model = transformers.GPT2LMHeadModel(config).eval()
    sd = model.state_dict()
    assert sd["lm_head.weight"].data_ptr() == sd["transformer.wte.weight"].data_ptr()  # tied, as a .pt holds it
    return model


def assignment(folder: Path, index_name: str) -> dict[str, str]:
    index = folder / index_name
    return json.loads(index.read_text())["weight_map"] if index.exists() else {}


# 300 * 32 * 4 = 38400 bytes of embedding: the limits put the tied pair first, in the middle and alone
@pytest.mark.parametrize("limit", [20_000, 40_000, 60_000])
@pytest.mark.parametrize("fmt", ["pytorch", "safetensors"])
def test_tied_tensors_are_split_as_huggingface_hub_splits(tmp_path: Path, gpt2: object, limit: int,
                                                          fmt: str) -> None:
    sd = gpt2.state_dict()  # type: ignore[attr-defined]
    torch.save(sd, tmp_path / "m.pt")
    assert migrate("convert", str(tmp_path / "m.pt"), f"{tmp_path}/out/", "--max-shard-size", str(limit),
                   "--to", fmt) == 0
    pattern = "model{suffix}.safetensors" if fmt == "safetensors" else "pytorch_model{suffix}.bin"
    split = hf_serialization.split_torch_state_dict_into_shards(sd, filename_pattern=pattern, max_shard_size=limit)
    index_name = "model.safetensors.index.json" if fmt == "safetensors" else "pytorch_model.bin.index.json"
    assert split.is_sharded
    assert assignment(tmp_path / "out", index_name) == split.tensor_to_filename
    index = json.loads((tmp_path / "out" / index_name).read_text())
    assert index["metadata"]["total_size"] == split.metadata["total_size"]
    # transformers loads the folder, and the tie holds
    gpt2.config.save_pretrained(tmp_path / "out")  # type: ignore[attr-defined]
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    got = model.state_dict()
    for k, v in sd.items():
        assert torch.equal(got[k], v), k
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, gpt2(ids).logits)  # type: ignore[operator]
    if fmt == "pytorch":  # one storage for both names, as torch.save wrote them
        shard = split.tensor_to_filename["lm_head.weight"]
        loaded = torch.load(tmp_path / "out" / shard, weights_only=True)
        assert loaded["lm_head.weight"].data_ptr() == loaded["transformer.wte.weight"].data_ptr()

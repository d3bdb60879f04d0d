"""Megatron-core `torch_dist` checkpoints read without megatron or torch (`formats/torch_dist/`).

The oracle is megatron-core 0.16.1 itself (`tests/support/torch_dist.py`): it writes a tiny GPT
(2 layers, GQA, tensor-parallel over 2 gloo ranks on CPU) with `dist_checkpointing.save`, and reads it
back with `load_plain_tensors`; each per-layer tensor migrator lists must equal megatron's stacked
tensor at that layer, bit for bit. megatron-core <= 0.15's `MCoreMetadata` and the expert axis are
checked on folders torch's `dcp.save` writes, against torch's own indexing.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.hostile import refused
from tests.support.torch_dist import PADDED, VOCAB, cached_checkpoint, megatron_files

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
slow = pytest.mark.slow  # megatron-core writing on 2 ranks: ~15-50 s, once per session

from migrator.files.io import open_file  # noqa: E402


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    pytest.importorskip("megatron.core")
    return cached_checkpoint(tmp_path_factory, "llama")


def _tensor(reader: Any, name: str) -> Any:
    return torch.from_numpy(reader[name].numpy().copy())


@slow
def test_every_tensor_equals_megatrons_own_reading(written: tuple[Path, dict[str, Any]]) -> None:
    folder, oracle = written
    plain = oracle["plain"]
    with open_file(folder) as r:
        assert r.format == "torch_dist"
        seen = set()
        for name in r.names():
            parts = name.split(".")
            if name.startswith("decoder.layers."):
                key = "decoder.layers." + ".".join(parts[3:])
                expected = plain[key][int(parts[2])]
                seen.add(key)
            elif name in ("embedding.word_embeddings.weight", "output_layer.weight"):
                assert plain[name].shape[0] == PADDED
                expected = plain[name][:VOCAB]  # the args give vocab_size: the padding rows are cut
                seen.add(name)
            else:
                expected = plain[name]
                seen.add(name)
            assert torch.equal(_tensor(r, name), expected), name
        assert seen == set(plain)  # nothing megatron reads is missing
        assert [n for n in r.names() if n.startswith("decoder.layers.")][:2] == [
            "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
            "decoder.layers.0.self_attention.linear_proj.weight"]  # layer-major
        notes = " ".join(r.notes)
        assert "_extra_state" in notes and "padding" in notes and "per layer" in notes


@slow
def test_inspect_and_convert_from_the_command_line(written: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    folder, oracle = written
    done = migrate_in_process("inspect", str(folder))
    assert done.returncode == 0, done.stderr
    assert "torch_dist" in done.stdout and "decoder.layers.1.mlp.linear_fc2.weight" in done.stdout
    done = migrate_in_process("convert", str(folder / ".metadata"), str(tmp_path / "out.safetensors"))
    assert done.returncode == 0, done.stderr
    from safetensors.torch import load_file

    out = load_file(tmp_path / "out.safetensors")
    assert torch.equal(out["decoder.layers.1.self_attention.linear_qkv.weight"],
                       oracle["plain"]["decoder.layers.self_attention.linear_qkv.weight"][1])


@slow
def test_args_are_the_recipes_config(written: tuple[Path, dict[str, Any]]) -> None:
    """common.pt's Namespace read as data: Megatron's enum values and torch dtypes are no objects."""
    from migrator.files.model_config import find_config, load_config

    folder, _ = written
    path = find_config(None, str(folder), folder)
    assert path == folder / "common.pt"
    config = load_config(path)
    assert config["num_query_groups"] == 2 and config["num_attention_heads"] == 4 and config["kv_channels"] == 16
    assert config["params_dtype"] == "float32" and config["attention_backend"] is None


def _stand_in(module: str, cls: type, obj_of: Any) -> bytes:
    """`obj_of(stand_in_class)` pickled (protocol 2: GLOBAL names the class as text) with the class
    named under `module`, as a file written where that module exists would name it."""
    stand_in = "mcore_stand_in"
    cls.__module__ = stand_in
    sys.modules[stand_in] = types.ModuleType(stand_in)
    setattr(sys.modules[stand_in], cls.__name__, cls)
    try:
        data = pickle.dumps(obj_of(cls), protocol=2)
    finally:
        del sys.modules[stand_in]
    assert data.count(f"c{stand_in}\n".encode()) == 1
    return data.replace(f"c{stand_in}\n".encode(), f"c{module}\n".encode())


class MCoreMetadata:
    """megatron-core <= 0.15's subclass of DCP's Metadata: its fields plus `mcore_data`."""


def _args(**kw: Any) -> argparse.Namespace:
    base = {"num_layers": 2, "num_attention_heads": 2, "hidden_size": 4, "group_query_attention": False,
            "num_query_groups": 1, "num_experts": 3}
    return argparse.Namespace(**{**base, **kw})


def _stacked(folder: Path, args: argparse.Namespace | None) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    sd = {"decoder.layers.self_attention.linear_proj.weight": torch.randn(2, 4, 4, generator=g),
          "decoder.layers.mlp.experts.experts.linear_fc2.weight": torch.randn(2, 3, 4, 5, generator=g),
          "decoder.final_layernorm.weight": torch.ones(4)}
    dcp.save(sd, checkpoint_id=str(folder))
    megatron_files(folder, args)
    return sd


def test_megatron_015_metadata_and_the_expert_axis(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    sd = _stacked(folder, _args())
    with open(folder / ".metadata", "rb") as f:
        meta = pickle.load(f)

    def make(cls: type) -> Any:
        obj = cls.__new__(cls)
        obj.__dict__.update({**vars(meta), "mcore_data": {"x": {"nd_reformulated_orig_global_shape": None}}})
        return obj

    (folder / ".metadata").write_bytes(
        _stand_in("megatron.core.dist_checkpointing.strategies.torch", MCoreMetadata, make))
    with open_file(folder) as r:
        assert r.format == "torch_dist"
        for i in range(2):
            assert torch.equal(_tensor(r, f"decoder.layers.{i}.self_attention.linear_proj.weight"),
                               sd["decoder.layers.self_attention.linear_proj.weight"][i])
            for e in range(3):
                assert torch.equal(_tensor(r, f"decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight"),
                                   sd["decoder.layers.mlp.experts.experts.linear_fc2.weight"][i, e])
        assert torch.equal(_tensor(r, "decoder.final_layernorm.weight"), torch.ones(4))


@pytest.mark.parametrize(("args", "words"), [
    (_args(num_layers=3), "num_layers 3"),
    (_args(num_experts=4), "num_experts 4"),
])
def test_a_stacked_axis_that_disagrees_with_the_args_is_refused(tmp_path: Path, args: argparse.Namespace,
                                                                 words: str) -> None:
    folder = tmp_path / "ckpt"
    _stacked(folder, args)
    done = refused(["inspect", str(folder)], tmp_path, words=words, codes=(1,))
    assert "decoder.layers." in done.stderr


def test_a_hostile_common_pt_runs_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _stacked(folder, _args())

    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("pwned",))

    torch.save({"args": Boom()}, folder / "common.pt")
    done = refused(["inspect", str(folder)], tmp_path, words="common.pt", codes=(1,))
    assert "pwned" not in done.stdout


def test_another_backend_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _stacked(folder, _args())
    (folder / "metadata.json").write_text('{"sharded_backend": "zarr"}')
    refused(["inspect", str(folder)], tmp_path, words="zarr", codes=(1,))


def test_a_stranger_in_metadata_is_still_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _stacked(folder, _args())
    (folder / ".metadata").write_bytes(_stand_in("elsewhere", MCoreMetadata, lambda c: c()))
    done = refused(["inspect", str(folder)], tmp_path, words=".metadata", codes=(1,))
    assert "elsewhere.MCoreMetadata" in done.stderr


@pytest.mark.parametrize(("change", "words"), [
    ({"normalization": "LayerNorm"}, "normalization LayerNorm"),
    ({"swiglu": False}, "without swiglu"),
    ({"position_embedding_type": "learned_absolute"}, "position_embedding_type learned_absolute"),
    ({"rotary_percent": 0.5}, "rotary_percent 0.5"),
    ({"use_rope_scaling": True}, "use_rope_scaling"),
    ({"num_experts": 4, "moe_router_topk": 2, "moe_router_pre_softmax": True}, "moe_router_pre_softmax"),
    ({"num_experts": 4, "moe_router_topk": 2, "moe_shared_expert_intermediate_size": 8}, "shared experts"),
    ({"untie_embeddings_and_output_weights": False}, "has an output_layer.weight"),
])
def test_hf_config_refuses_what_the_family_cannot_express(change: dict[str, Any], words: str) -> None:
    """The config.json is made only for what Llama / Qwen / Mixtral can say; anything else is named."""
    from migrator.core.errors import PlanError
    from migrator.formats.torch_dist.hf_config import hf_config

    args = {"num_layers": 2, "hidden_size": 8, "ffn_hidden_size": 16, "num_attention_heads": 2,
            "group_query_attention": False, "max_position_embeddings": 16, "norm_epsilon": 1e-6,
            "rotary_base": 10000, "normalization": "RMSNorm", "swiglu": True, "position_embedding_type": "rope",
            "untie_embeddings_and_output_weights": True}
    shapes = {"embedding.word_embeddings.weight": (32, 8), "output_layer.weight": (32, 8)}
    made = hf_config(args, shapes, "ckpt")
    assert (made["model_type"], made["num_key_value_heads"], made["head_dim"]) == ("llama", 2, 4)
    with pytest.raises(PlanError, match=words):
        hf_config({**args, **change}, shapes, "ckpt")

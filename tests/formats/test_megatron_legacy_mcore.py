"""migrator's table of how Megatron divides each tensor between tensor-parallel ranks, and its numbering of
each pipeline stage's layers, checked against megatron-core 0.16.1 itself.

megatron-core marks each parameter its parallel layers divide (`tensor_model_parallel`, and the
`partition_dim`: 0 for ColumnParallelLinear and VocabParallelEmbedding, 1 for RowParallelLinear), and
its `sharded_state_dict` makes a gated MLP's `linear_fc1` a `ShardedTensorFactory` (the per-rank
[gate_r; up_r] re-interleaved when saved) and each `_extra_state` a `ShardedObject`. A tiny GPTModel
(local layer spec: no Transformer Engine on this CPU) is built in a subprocess on one gloo rank, in
two shapes that between them hold every kind of tensor of the table (GQA with SwiGLU, RMSNorm and q/k
norms; LayerNorm with biases, learned positions and a two-expert MoE with its router). Each stage's
(and virtual chunk's) first layer is megatron-core's `get_transformer_layer_offset` for even, uneven
and virtual pipelines.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from migrator.formats.megatron_legacy.layers import units
from migrator.formats.megatron_legacy.splits import split_of

if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core is not installed", allow_module_level=True)

LAYOUTS = {  # pipeline stages, virtual chunks, layers of the first / last stage, num_layers
    "even": (4, None, None, None, 8),
    "virtual 2x2": (2, 2, None, None, 8),
    "virtual 3x2": (3, 2, None, None, 12),
    "uneven": (3, None, 1, 3, 8),
    "first only": (3, None, 2, None, 8),
}

SCRIPT = r"""
import json, sys, warnings
LAYOUTS = """ + repr(LAYOUTS) + r"""
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig

torch.manual_seed(0)
shapes = {
    "llama": (dict(num_query_groups=2, gated_linear_unit=True, normalization="RMSNorm", add_bias_linear=False,
                   qk_layernorm=True),
              dict(normalization="RMSNorm", qk_layernorm=True), "rope"),
    "gpt-moe": (dict(add_bias_linear=True, add_qkv_bias=True, num_moe_experts=2, moe_router_topk=1,
                     moe_router_pre_softmax=True, moe_grouped_gemm=False),
                dict(num_experts=2, moe_grouped_gemm=False), "learned_absolute"),
}
out = {}
for tag, (config, spec, positions) in shapes.items():
    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96,
                            use_cpu_initialization=True, **config)
    model = GPTModel(cfg, get_gpt_layer_local_spec(**spec), vocab_size=128, max_sequence_length=16,
                     position_embedding_type=positions, share_embeddings_and_output_weights=False)
    out[tag] = {
        "params": {n: [bool(getattr(p, "tensor_model_parallel", False)), getattr(p, "partition_dim", -1)]
                   for n, p in model.named_parameters()},
        "sharded": {k: type(v).__name__ for k, v in model.sharded_state_dict().items()},
        "saved": list(model.state_dict()),
        "gated": bool(cfg.gated_linear_unit),
    }
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

offsets = {}
for tag, (pp, vp, first, last, n) in LAYOUTS.items():
    cfg = TransformerConfig(num_layers=n, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=pp,
                            virtual_pipeline_model_parallel_size=vp, num_layers_in_first_pipeline_stage=first,
                            num_layers_in_last_pipeline_stage=last, pipeline_dtype=torch.float32)
    offsets[tag] = {f"{p},{c}": get_transformer_layer_offset(cfg, vp_stage=c if vp else None, pp_rank=p)
                    for p in range(pp) for c in range(vp or 1)}
out["offsets"] = offsets
dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def mcore(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("mcore")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(folder / "store")], capture_output=True, text=True,
                          timeout=300, cwd=folder)
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("tag", ["llama", "gpt-moe"])
def test_each_parameters_split_is_megatron_cores_partition_dim(mcore: dict, tag: str) -> None:
    model = mcore[tag]
    assert len(model["params"]) >= 11
    for name, (parallel, dim) in model["params"].items():
        split = split_of(name)
        assert split is not None, name
        if parallel:
            assert split.dim == dim, (name, split, dim)
        else:
            assert split.kind == "replicated", (name, split)


@pytest.mark.parametrize("tag", ["llama", "gpt-moe"])
def test_a_gated_fc1_is_the_one_megatron_core_saves_through_a_factory(mcore: dict, tag: str) -> None:
    model = mcore[tag]
    factories = {k for k, kind in model["sharded"].items() if kind == "ShardedTensorFactory"}
    gated = {k for k in model["params"] if (s := split_of(k)) is not None and s.gated}
    if model["gated"]:  # SwiGLU: every fc1 weight is both
        assert factories and factories == {k for k in gated if k.endswith(".weight")}
    else:
        assert not factories


@pytest.mark.parametrize("tag", ["llama", "gpt-moe"])
def test_every_saved_entry_has_a_rule_and_extra_state_is_skipped(mcore: dict, tag: str) -> None:
    model = mcore[tag]
    for name in model["saved"]:  # what a legacy checkpoint's `model` holds: state_dict_for_save_checkpoint
        split = split_of(name)
        assert split is not None, name
        assert (split.kind == "skip") == name.endswith("._extra_state"), name
    objects = [k for k, kind in model["sharded"].items() if kind == "ShardedObject"]  # not tensors to megatron-core
    assert objects and all(split_of(k) == split_of(objects[0]) and split_of(k).kind == "skip"  # type: ignore[union-attr]
                           for k in objects)


class _File:
    def bad(self, message: str) -> AssertionError:
        return AssertionError(message)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_stage_and_chunks_first_layer_is_megatron_cores_offset(mcore: dict, layout: str) -> None:
    pp, vp, first, last, n = LAYOUTS[layout]
    args = {"num_layers": n, "virtual_pipeline_model_parallel_size": vp,
            "decoder_first_pipeline_num_layers": first, "decoder_last_pipeline_num_layers": last}
    found = units(args, pp, vp or 1, _File())  # type: ignore[arg-type]
    assert {f"{u.stage},{u.chunk}": u.first for u in found} == mcore["offsets"][layout]
    assert sum(u.count for u in found) == n
    assert [u.first for u in found] == sorted(u.first for u in found)  # listed in the order of the layers


def test_the_table_is_data_the_reader_never_branches_on_names() -> None:
    """The reader asks the table; no layer's name is spelled in its code."""
    package = Path(__file__).resolve().parents[2] / "migrator" / "formats" / "megatron_legacy"
    source = (package / "reader.py").read_text(encoding="utf-8")
    for word in ("qkv", "fc1", "linear_proj", "fc2", "word_embeddings", "layernorm", "dense", "output_layer"):
        assert word not in source, word

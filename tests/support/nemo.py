"""A NeMo 2 checkpoint folder, as NeMo's `MegatronCheckpointIO` and `TrainerContext.io_dump` lay it out,
written by megatron-core 0.16 on 2 gloo ranks (CPU): the oracle of `tests/formats/test_nemo.py` and
`tests/cli/test_nemo_recipes.py`.

NeMo itself is not installed for the tests: NeMo 3 no longer has `nemo.lightning.io` or
`nemo.collections.llm`, and NeMo 2.7 needs transformers 4.53 and huggingface-hub < 1 (the dev venv has
transformers 5). So each part is made by what NeMo calls, or the way NeMo's source makes it:

* `weights/`: megatron-core's `dist_checkpointing.save` of the GPTModel's
  `sharded_state_dict(prefix="module.")` (what `MegatronParallel._module_sharded_state_dict` asks for),
  inside the Lightning checkpoint dict NeMo's `MegatronStrategy.save_checkpoint` saves (`epoch`,
  `global_step`, `state_dict` emptied, `loops`, ... in `common.pt`), with its `content_metadata`;
* `context/model.yaml`: the model and its configuration dumped as `IOMixin._io_dump_yaml` does, every
  field of the configuration's dataclass with its default unless given (`_ordered_arguments_with_default`),
  a function or a torch dtype as `{_target_: NAME, _call_: false}`, another object as its class with
  `_call_: true`, keys sorted (nemo_run's YamlSerializer); the field values are the ones the
  TransformerConfig that wrote the weights was given, so a wrong reading shows in the logits;
* `context/io.json`: fiddle's JSON serialization of the same context (`trainer_context_1` -> `model` ->
  `config`), which records only the arguments given.

The layout was checked against a context NeMo 2.7.3 wrote in a scratch environment (the same keys,
`_target_` forms and fiddle objects).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import socket
from pathlib import Path
from typing import Any

from tests.support.dist import end_rank
from tests.support.torch_dist import (
    FFN,
    GROUPS,
    HEADS,
    HIDDEN,
    LAYERS,
    PADDED,
    SEQ,
    cpu_logits,
    join_megatron_group,
)

CONFIG_CLASS = "nemo.collections.llm.gpt.model.llama.Llama3Config"
MODEL_CLASS = "nemo.collections.llm.gpt.model.llama.LlamaModel"
CONTENT_METADATA = {"distrib_optim_sharding_type": "dp_zero_gather_scatter", "chained_optim_avoid_prefix": True}


def _given(tied: bool) -> dict[str, Any]:
    """The arguments the configuration is given (NeMo's Llama3Config fields; TransformerConfig's and
    GPTConfig's)."""
    import torch

    return dict(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
                ffn_hidden_size=FFN, kv_channels=HIDDEN // HEADS, gated_linear_unit=True,
                activation_func=torch.nn.functional.silu, normalization="RMSNorm", layernorm_epsilon=1e-5,
                add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.2,
                params_dtype=torch.float32, seq_length=SEQ, vocab_size=PADDED, position_embedding_type="rope",
                rotary_base=10000, rotary_percent=1.0, share_embeddings_and_output_weights=tied)


def _ref(name: str) -> dict[str, Any]:
    return {"_call_": False, "_target_": name}


GPT_FIELDS = {"fp16_lm_cross_entropy": False, "parallel_output": True, "share_embeddings_and_output_weights": True,
              "make_vocab_size_divisible_by": 128, "position_embedding_type": "learned_absolute",
              "rotary_base": 10000, "rotary_percent": 1.0, "seq_len_interpolation_factor": None, "seq_length": 1024,
              "attention_softmax_in_fp32": False, "deallocate_pipeline_outputs": True,
              "scatter_embedding_sequence_parallel": True, "use_transformer_engine_full_layer_spec": False,
              "use_transformer_engine_op_fuser": None, "generation_config": None, "vocab_size": None,
              "tp_comm_overlap_cfg": None,
              "transformer_layer_spec": _ref("nemo.collections.llm.gpt.model.base.default_layer_spec"),
              "forward_step_fn": _ref("nemo.collections.llm.gpt.model.base.gpt_forward_step"),
              "data_step_fn": _ref("nemo.collections.llm.gpt.model.base.gpt_data_step")}
"""The fields NeMo's GPTConfig adds to TransformerConfig, with their defaults (llm/gpt/model/base.py)."""


def _represent(v: Any) -> Any:
    """A value as NeMo's YAML dump writes it (`_safe_object_representer`)."""
    import torch

    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_represent(x) for x in v]
    if isinstance(v, dict):
        return {k: _represent(x) for k, x in v.items()}
    if isinstance(v, torch.dtype):
        return {"_call_": False, "_target_": str(v)}
    if callable(v) and hasattr(v, "__qualname__") and not isinstance(v, enum.Enum):
        return {"_call_": False, "_target_": f"{v.__module__}.{v.__qualname__}"}
    return {"_call_": True, "_target_": f"{type(v).__module__}.{type(v).__qualname__}"}


def model_yaml(given: dict[str, Any]) -> dict[str, Any]:
    """context/model.yaml's document for a configuration given `given`."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    config: dict[str, Any] = {}
    for f in dataclasses.fields(TransformerConfig):
        if f.name in given:
            config[f.name] = given[f.name]
        elif f.default is not dataclasses.MISSING:
            config[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            config[f.name] = f.default_factory()
    for name, default in GPT_FIELDS.items():
        config[name] = given.get(name, default)
    doc = {k: _represent(v) for k, v in config.items()}
    doc["_target_"] = CONFIG_CLASS
    return {"_target_": MODEL_CLASS, "config": doc, "model_context_managers": [], "model_transform": None,
            "optim": {"_target_": "nemo.lightning.pytorch.optim.megatron.MegatronOptimizerModule",
                      "config": {"_target_": "megatron.core.optimizer.optimizer_config.OptimizerConfig",
                                 "lr": 0.0001, "optimizer": "adam"}},
            "tokenizer": None}


def io_json(given: dict[str, Any]) -> dict[str, Any]:
    """context/io.json: fiddle's serialization of the trainer context, the configuration's given
    arguments only."""
    import torch

    def pyref(module: str, name: str) -> dict[str, Any]:
        return {"type": "pyref", "module": module, "name": name}

    config_type = pyref("fiddle._src.config", "Config")

    def value(v: Any, path: str) -> Any:
        if isinstance(v, torch.dtype):
            return {**pyref("torch", str(v).removeprefix("torch.")), "paths": [path]}
        if callable(v):
            return {**pyref(v.__module__, v.__qualname__), "paths": [path]}
        return {"type": "leaf", "value": v, "paths": [path]}

    objects: dict[str, Any] = {}

    def obj(key: str, cls: str, items: list[list[Any]], path: str) -> dict[str, Any]:
        """A fiddle Config object; its class is in its BuildableTraverserMetadata object."""
        meta = f"buildable_traverser_metadata_{len(objects) // 2 + 1}"
        objects[meta] = {"type": pyref("fiddle._src.config", "BuildableTraverserMetadata"),
                         "items": [["Attr(name='fn_or_cls')", pyref(*cls.rsplit(".", 1))]],
                         "metadata": pyref("fiddle._src.config", "BuildableTraverserMetadata")}
        objects[key] = {"type": config_type, "items": items, "metadata": {"type": "ref", "key": meta},
                        "paths": [path]}
        return {"type": "ref", "key": key}

    root = "<root>.model.config"
    config = obj("llama3_config_1", CONFIG_CLASS,
                 [[f"Attr(name='{k}')", value(v, f"{root}.{k}")] for k, v in given.items()], root)
    model = obj("llama_model_1", MODEL_CLASS, [["Attr(name='config')", config]], "<root>.model")
    top = obj("trainer_context_1", "nemo.lightning.io.pl.TrainerContext",
              [["Attr(name='model')", model],
               ["Attr(name='extra')", {"type": "leaf", "value": None, "paths": ["<root>.extra"]}]], "<root>")
    return {"root": top, "objects": objects, "refcounts": {k: 1 for k in objects}, "version": "0.0.1"}


def write_context(folder: Path, given: dict[str, Any]) -> None:
    import yaml

    context = folder / "context"
    context.mkdir(parents=True, exist_ok=True)
    (context / "model.yaml").write_text(yaml.safe_dump(model_yaml(given), sort_keys=True))
    (context / "io.json").write_text(json.dumps(io_json(given), indent=2))
    write_tokenizer(context / "nemo_tokenizer")


def write_tokenizer(folder: Path) -> None:
    """A tiny Hugging Face tokenizer saved with `save_pretrained`, as NeMo keeps an AutoTokenizer's files
    in `context/nemo_tokenizer/`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(PADDED - 3)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)


def _optimizer_state(model: Any, model_sd: dict[str, Any]) -> dict[str, Any]:
    """megatron-core's sharded state of a torch Adam over the model (as its FP32Optimizer makes it):
    `optimizer.state.exp_avg.<the parameter's key>`, sharded as the parameter is; param_groups to
    common.pt."""
    import torch
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    params = [p for p in model.parameters() if p.requires_grad]
    adam = torch.optim.Adam(params, lr=1e-3)
    for i, p in enumerate(params):  # fixed gradients: the moments are a function of the rank's shard
        p.grad = torch.full_like(p, 0.01 * (i + 1))
    adam.step()
    state = adam.state_dict()
    ids = get_param_id_to_sharded_param_map(model_sd, params)
    optim_state_to_sharding_state(state, ids, exclude_keys=("step",))
    return state


def _worker(rank: int, world: int, port: int, out: str, tied: bool, optimizer: bool = True) -> None:
    import torch

    join_megatron_group(rank, world, port)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    given = _given(tied)
    gpt = {k: given[k] for k in GPT_FIELDS if k in given}
    torch.manual_seed(4321)  # the same on every rank (replicated norms agree; the CPU init draws whole weights)
    cfg = TransformerConfig(**{k: v for k, v in given.items() if k not in gpt}, use_cpu_initialization=True)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=gpt["vocab_size"],
                     max_sequence_length=gpt["seq_length"], position_embedding_type=gpt["position_embedding_type"],
                     rotary_base=gpt["rotary_base"], rotary_percent=gpt["rotary_percent"],
                     share_embeddings_and_output_weights=gpt["share_embeddings_and_output_weights"],
                     parallel_output=False)
    with torch.no_grad():  # norms away from their init (ones), so a swap would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + 1.0)
    model.eval()
    weights = Path(out) / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    model_sd = model.sharded_state_dict(prefix="module.")
    checkpoint = {"epoch": 0, "global_step": 7, "pytorch-lightning_version": "2.4.0", "state_dict": {},
                  "loops": {"fit_loop": {"state_dict": {}, "epoch_loop.state_dict": {"_batches_that_stepped": 7}}},
                  "callbacks": {}, "optimizer_states": {}, "lr_schedulers": [], "sharded_state_dict": model_sd}
    if optimizer:  # what NeMo saves by default (ckpt_save_optimizer): one Adam step's state
        checkpoint["optimizer"] = [_optimizer_state(model, model_sd)]
    dist_checkpointing.save(checkpoint, str(weights), content_metadata=CONTENT_METADATA)
    torch.distributed.barrier()
    logits = cpu_logits(model)
    plain = dist_checkpointing.load_plain_tensors(str(weights))  # collective: every rank calls it
    if rank == 0:
        tensors = {k: v.clone() for k, v in plain.items() if isinstance(v, torch.Tensor)}
        torch.save({"plain": tensors, "logits": logits.clone()}, Path(out).parent / f"{Path(out).name}-oracle.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    import multiprocessing

    for child in multiprocessing.active_children():  # megatron-core's persistent async-save worker outlives
        child.terminate()  # os._exit (it waits on its queue forever, ~200 MB each): end it with its rank
        child.join()
    end_rank()


def write_nemo_checkpoint(out: Path, *, tied: bool = False) -> dict[str, Any]:
    """Write the NeMo 2 folder `out/` (weights/ and context/); return megatron's own reading of
    weights/ (`plain`: load_plain_tensors, names with `module.`) and its logits for `TOKENS`."""
    import torch
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, str(out), tied), nprocs=2)
    write_context(out, _given(tied))  # here, not in a rank: the tokenizer's save (Rust threads) once hung there
    return torch.load(out.parent / f"{out.name}-oracle.pt", weights_only=True)


_WRITTEN: dict[bool, tuple[Path, dict[str, Any]]] = {}


def cached_nemo_checkpoint(factory: Any, *, tied: bool = False) -> tuple[Path, dict[str, Any]]:
    """`write_nemo_checkpoint` once per test session (`factory`: pytest's tmp_path_factory)."""
    if tied not in _WRITTEN:
        out = factory.mktemp(f"nemo{'-tied' if tied else ''}") / "nemo-ckpt"
        _WRITTEN[tied] = (out, write_nemo_checkpoint(out, tied=tied))
    return _WRITTEN[tied]

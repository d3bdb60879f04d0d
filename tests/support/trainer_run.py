"""Hugging Face Trainer checkpoints written by transformers' Trainer itself, on this CPU, for the tests
of a Trainer folder read as one training checkpoint (`migrator.files.trainer`).

`python tests/support/trainer_run.py train OUT` (a new process: the Trainer and accelerate set process-wide
state) trains each tiny model of `MODELS` (a Llama, a GPT-2, a Phi-3 of the Llama's sizes) for `STEPS`
steps on random token data (fixed seeds, AdamW with weight decay: the Trainer's two param groups) and
saves `OUT/<model>/checkpoint-<STEPS>/`; beside it, `OUT/<model>/oracle.pt` holds what the Trainer's
own optimizer held at that point, by parameter name (`{"state": {name: {key: tensor}}, "groups":
[[names]]}`), and `OUT/<model>/order.pt` the model's `named_parameters()` (a parameter-order file a
user would save).

`python tests/support/trainer_run.py resume OUT.pt MODEL FOLDER...` resumes a Trainer of MODEL from each FOLDER
(`Trainer.train(resume_from_checkpoint=FOLDER)`) for one more step and saves, per folder, the
parameters and the optimizer's `state_dict()` after it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

STEPS = 3
MODELS = ("llama", "gpt2", "phi3")


def _model(kind: str) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "phi3":  # fused qkv_proj and gate_up_proj, o_proj declared before qkv_proj
        from transformers import Phi3Config, Phi3ForCausalLM

        return Phi3ForCausalLM(Phi3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                                          pad_token_id=0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False))
    if kind == "llama":  # untied head, RMSNorm (no decay by name), GQA
        return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                            tie_word_embeddings=False))
    # tied head, LayerNorm modules named ln_* (no decay by module type), Conv1D weights
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=32, bos_token_id=0,
                                      eos_token_id=0))


def _trainer(kind: str, out: str, steps: int, save: bool) -> Any:
    import torch
    from transformers import Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids.clone()}

    args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=4, learning_rate=1e-2,
                             weight_decay=0.1, warmup_steps=2, lr_scheduler_type="constant_with_warmup", use_cpu=True,
                             report_to=[], seed=0, logging_steps=1000, save_strategy="steps" if save else "no",
                             save_steps=steps, dataloader_num_workers=0, disable_tqdm=True)
    return Trainer(model=_model(kind), args=args, train_dataset=Tokens())


def train(out: Path) -> None:
    import torch

    for kind in MODELS:
        trainer = _trainer(kind, str(out / kind), STEPS, save=True)
        trainer.train()
        names = {id(p): n for n, p in trainer.model.named_parameters()}
        opt = trainer.optimizer
        state = {names[id(p)]: {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
        groups = [[names[id(p)] for p in g["params"]] for g in opt.param_groups]
        torch.save({"state": state, "groups": groups}, out / kind / "oracle.pt")
        torch.save({n: p.detach().clone() for n, p in trainer.model.named_parameters()}, out / kind / "order.pt")


def resume(out: Path, kind: str, folders: list[str]) -> None:
    import torch

    done = {}
    for folder in folders:
        trainer = _trainer(kind, str(out.parent / f"resume-{len(done)}"), STEPS + 1, save=False)
        trainer.train(resume_from_checkpoint=folder)
        done[folder] = {"params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                        "optimizer": trainer.optimizer.state_dict()}
    torch.save(done, out)


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(Path(sys.argv[2]))
    else:
        resume(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])

"""Computed weights: LoRA adapters folded into their base, and mergekit's merges, streamed band by band.

- `arithmetic`: element-wise merge ops as lazy tensors (linear, scale, task arithmetic/TIES/DARE, SLERP,
  passthrough);
- `lora`: the LoRA (and DoRA) fold of one weight as a lazy tensor;
- `peft_adapter`: a PEFT adapter folder read, checked and planned onto a base model's names;
- `mergekit_config`: mergekit's YAML read and resolved into a neutral per-tensor merge spec;
- `execute`: a driver from a plan or spec to written Hugging Face folders.

Nothing here imports torch; every module imports numpy only when bytes are computed.
"""

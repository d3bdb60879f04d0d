"""Computed weights: LoRA adapters folded into their base, and mergekit's merges, streamed band by band.

- `arithmetic`: element-wise merge ops as lazy tensors (linear, scale, task arithmetic/TIES/DARE, SLERP,
  passthrough);
- `lora`: the LoRA (and DoRA) fold of one weight as a lazy tensor;
- `peft_adapter`: a PEFT adapter folder read, checked and planned onto a base model's names;
- `tensors`: a fold plan or a merge spec (`recipe.mergekit`) turned into the output's lazy tensors.

Nothing here imports torch; every module imports numpy only when bytes are computed.
"""

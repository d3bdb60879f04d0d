"""The streamed arithmetic of computed tensors, shared by the computed ops (`ops/linear.py`, ...) and the
whole-model merges and folds (`transform/merging`): band by band, in F32 (F64 when an input is F64),
rounded once.

- `bands`: the band engine (inputs decoded a band at a time, a kernel per band, the result's pieces);
- `arithmetic`: element-wise merges as lazy tensors (linear, scale, task arithmetic/TIES/DARE, SLERP,
  passthrough);
- `lora`: the LoRA (and DoRA) fold of one weight as a lazy tensor; `lora_product`: B @ A in torch's
  summation order.

Nothing here imports torch; every module imports numpy only when bytes are computed.
"""

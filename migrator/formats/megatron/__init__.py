"""What Megatron's two checkpoint formats share: the training arguments (`args`, the pickled arguments
object `formats.pytorch.namespace` reads) and the values saved beside them (`args.py`, read by the
`torch_dist` and the legacy reader), and the arguments a Hugging Face config.json describes
(`from_hf.py`, written into the `common.pt` of a `torch_dist` target)."""

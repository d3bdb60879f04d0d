"""Legacy Megatron-LM checkpoints, `iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt` (`formats/megatron_legacy/`),
joined into global tensors. Read only."""

from __future__ import annotations

from ..spec import FormatSpec

SPEC = FormatSpec(
    name="megatron-legacy", title="Megatron-LM legacy checkpoint",
    summary="Megatron-LM `torch` checkpoint (`iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt`)",
    recognized_by="`latest_checkpointed_iteration.txt` or `mp_rank_*/model_optim_rng.pt` folders", folder=True,
    torch_names=True)

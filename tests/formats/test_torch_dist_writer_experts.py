"""The torch_dist target's expert axis, without megatron: what it refuses (one expert's tensor kept apart,
experts that disagree on their count) in one line naming the tensor, and the `_extra_state` keys it adds per
layer and expert, read by torch's DCP (`tests/formats/test_torch_dist_writer_families.py` has megatron-core
load them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
st_torch = pytest.importorskip("safetensors.torch")

FC1 = "decoder.layers.mlp.experts.experts.linear_fc1.weight"


def _convert(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> tuple[int, str]:
    st_torch.save_file(tensors, str(tmp_path / "m.safetensors"))
    done = migrate_in_process("convert", str(tmp_path / "m.safetensors"), str(tmp_path / "ckpt"), "--to", "torch_dist")
    return done.returncode, done.stderr


def test_each_layer_and_expert_has_its_extra_state_and_torch_reads_the_experts(tmp_path: Path) -> None:
    tensors = {FC1: torch.randn(2, 3, 8, 4), "decoder.layers.mlp.router.weight": torch.randn(2, 3, 4)}
    code, err = _convert(tmp_path, tensors)
    assert code == 0, err
    md = dcp.FileSystemReader(str(tmp_path / "ckpt")).read_metadata()
    extra = sorted(k for k in md.state_dict_metadata if "_extra_state" in k)
    assert extra == [f"decoder.layers.mlp.experts.experts.linear_fc1._extra_state/shard_{layer}.{e}_2.3"
                     for layer in range(2) for e in range(3)]  # the router is no linear layer: none
    back = {k: torch.empty_like(v) for k, v in tensors.items()}
    dcp.load(back, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    assert all(torch.equal(back[k], v) for k, v in tensors.items())


@pytest.mark.parametrize(("tensors", "message"), [
    ({"decoder.layers.mlp.experts.local_experts.0.linear_fc1.weight": torch.zeros(2, 8, 4)},
     "'decoder.layers.mlp.experts.local_experts.0.linear_fc1.weight': one expert's tensor"),
    ({FC1: torch.zeros(2, 3, 8, 4), "decoder.layers.mlp.experts.experts.linear_fc2.weight": torch.zeros(2, 4, 4, 4)},
     f"'decoder.layers.mlp.experts.experts.linear_fc2.weight': its expert axis has 4 experts; {FC1} has 3"),
    ({FC1: torch.zeros(2)}, f"'{FC1}': a stacked tensor leads with its layer and expert axis; this one has 1"),
])
def test_experts_kept_apart_or_disagreeing_are_refused(tensors: dict[str, torch.Tensor], message: str,
                                                       tmp_path: Path) -> None:
    code, err = _convert(tmp_path, tensors)
    assert code == 1 and "\n" not in err.strip(), err
    assert message in err, err
    assert not (tmp_path / "ckpt").exists()

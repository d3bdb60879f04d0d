"""Broken and hostile megatron-core `torch_dist` checkpoints through the command line (issue 44 item 5):
`migrate convert CKPT out.safetensors --overwrite` over an existing target exits 1 with one line naming
the file (and the tensor where there is one), no traceback, the target and the checkpoint byte for
byte as they were, and no code from a pickle run (`tests.support.hostile.refused`; a live payload
would create a sentinel file).

The checkpoint is what megatron-core's `dist_checkpointing.save` lays out, written here by torch's own
`dcp.save` (one process) plus megatron-core's `metadata.json` and a `common.pt` holding Megatron-LM's
`args` (`tests.support.torch_dist.megatron_files`); one tensor's chunk is moved into a second rank's
file `__1_0.distcp`, as two ranks write it. Each case breaks one thing: `.metadata` or `common.pt`
(pickles that call `os.system`, `eval`, or claim huge lengths: `tests.support.pickles`' builders), a
missing or truncated rank file, another backend, a stacked layer axis or the vocabulary's rows
against the arguments. The same cases on megatron-core 0.16.1's own checkpoint are at the end.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import migrate_in_process
from tests.support.hostile import refused
from tests.support.torch_dist import SECOND_RANK_FILE, two_rank_folder

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))  # tests.support.pickles imports tools/fuzz.py
from tests.support.pickles import P2, P4, in_zip, u  # noqa: E402

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

QKV = "decoder.layers.self_attention.linear_qkv.weight"
FC2 = "decoder.layers.mlp.linear_fc2.weight"  # stored in the second rank's file
EMBED = "embedding.word_embeddings.weight"
RANK1 = SECOND_RANK_FILE
MCORE = "megatron.core.dist_checkpointing.strategies.torch"


def _args(**change: Any) -> argparse.Namespace:
    base = {"num_layers": 2, "hidden_size": 4, "num_attention_heads": 2, "group_query_attention": False,
            "padded_vocab_size": 8, "vocab_size": 6}
    return argparse.Namespace(**{**base, **change})


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    return {EMBED: torch.randn(8, 4, generator=g), QKV: torch.randn(2, 6, 4, generator=g),
            FC2: torch.randn(2, 4, 5, generator=g), "decoder.final_layernorm.weight": torch.randn(4, generator=g),
            "output_layer.weight": torch.randn(8, 4, generator=g)}


def _write(folder: Path, sd: dict[str, Any], args: argparse.Namespace | None) -> None:
    """`sd` as megatron-core lays it out, FC2's chunk in the second rank's file."""
    two_rank_folder(folder, sd, args, FC2)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("torch-dist") / "ckpt"
    _write(folder, _state(), _args())
    return folder


def test_the_unbroken_checkpoint_reads_as_torch_indexes_it(good: Path, tmp_path: Path) -> None:
    """The base of every case is read: each layer is torch's `stacked[i]`, the vocabulary `[:vocab_size]`."""
    from safetensors.torch import load_file

    done = migrate_in_process("convert", str(good), str(tmp_path / "out.safetensors"))
    assert done.returncode == 0, done.stderr
    out, sd = load_file(tmp_path / "out.safetensors"), _state()
    for i in range(2):
        assert torch.equal(out[f"decoder.layers.{i}.mlp.linear_fc2.weight"], sd[FC2][i])
        assert torch.equal(out[f"decoder.layers.{i}.self_attention.linear_qkv.weight"], sd[QKV][i])
    for name in (EMBED, "output_layer.weight"):
        assert torch.equal(out[name], sd[name][:6])


# ---- the cases: each edits a copy of the good folder; `s` is the sentinel a live payload would create


def _cmd(s: Path) -> str:
    return f"touch {s}"


def s0(text: str) -> bytes:
    """Protocol 0 STRING."""
    return b"S'" + text.encode() + b"'\n"


def _metadata(make: Callable[[Path], bytes]) -> Callable[[Path, Path], None]:
    def edit(folder: Path, s: Path) -> None:
        (folder / ".metadata").write_bytes(make(s))
    return edit


def _common(make: Callable[[Path], bytes]) -> Callable[[Path, Path], None]:
    """common.pt a torch.save zip whose data.pkl is `make(s)`."""
    def edit(folder: Path, s: Path) -> None:
        (folder / "common.pt").write_bytes(in_zip(make(s)))
    return edit


def _common_obj(obj: Callable[[Path], Any]) -> Callable[[Path, Path], None]:
    """common.pt written by torch.save itself."""
    def edit(folder: Path, s: Path) -> None:
        torch.save(obj(s), folder / "common.pt")
    return edit


class _System:
    """Unpickled by pickle or torch.load, runs `touch SENTINEL`."""

    def __init__(self, s: Path) -> None:
        self.s = s

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (_cmd(self.s),)


def _namespace_calling(s: Path) -> bytes:
    """A Namespace (allow-listed) whose BUILD state holds `os.system(...)`'s result as num_layers."""
    return (P2 + b"}(" + u("args") + b"cargparse\nNamespace\n)\x81}(" + u("num_layers") + b"cos\nsystem\n"
            + u(_cmd(s)) + b"\x85Rub" + u("iteration") + b"K\x01u.")


def _save_plan_calling(callable_: bytes) -> Callable[[Path], bytes]:
    """megatron-core 0.16's SavePlan (allow-listed as an inert record) built from `callable_(cmd)`'s result."""
    return lambda s: (P2 + b"ctorch.distributed.checkpoint.planner\nSavePlan\n(" + callable_ + b"(" + s0(_cmd(s))
                      + b"tRtR.")


def _mcore_metadata_calling(s: Path) -> bytes:
    """megatron-core <= 0.15's MCoreMetadata whose mcore_data holds `os.system(...)`."""
    return (P2 + b"c" + MCORE.encode() + b"\nMCoreMetadata\n)\x81}(" + u("mcore_data") + b"cos\nsystem\n"
            + u(_cmd(s)) + b"\x85Rub.")


def _bytes(name: str, data: bytes) -> Callable[[Path, Path], None]:
    def edit(folder: Path, s: Path) -> None:
        (folder / name).write_bytes(data)
    return edit


def _remove(name: str) -> Callable[[Path, Path], None]:
    def edit(folder: Path, s: Path) -> None:
        (folder / name).unlink()
    return edit


def _truncate(name: str, keep: float) -> Callable[[Path, Path], None]:
    def edit(folder: Path, s: Path) -> None:
        os.truncate(folder / name, int((folder / name).stat().st_size * keep))
    return edit


def _backend(text: str) -> Callable[[Path, Path], None]:
    def edit(folder: Path, s: Path) -> None:
        (folder / "metadata.json").write_text(text)
    return edit


def _rewrite(sd_change: Callable[[dict[str, Any]], None],
             args: argparse.Namespace | None) -> Callable[[Path, Path], None]:
    """The folder written again from a changed state dict and arguments (None: common.pt without args)."""
    def edit(folder: Path, s: Path) -> None:
        for f in folder.iterdir():
            f.unlink()
        sd = _state()
        sd_change(sd)
        _write(folder, sd, args)
        if args is None:
            torch.save({"checkpoint_version": 3.0, "iteration": 1}, folder / "common.pt")
    return edit


def _stacked(name: str, layers: int) -> Callable[[dict[str, Any]], None]:
    def change(sd: dict[str, Any]) -> None:
        sd[name] = torch.zeros(layers, *sd[name].shape[1:])
    return change


def _vocab(rows: int) -> Callable[[dict[str, Any]], None]:
    def change(sd: dict[str, Any]) -> None:
        sd[EMBED] = torch.zeros(rows, 4)
        sd["output_layer.weight"] = torch.zeros(rows, 4)
    return change


def _same(sd: dict[str, Any]) -> None:
    pass


# name -> (edit, words the one line must hold)
CASES: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    # .metadata: code, callables megatron's allowed classes are built from, huge claims
    "metadata GLOBAL os.system": (_metadata(lambda s: b"cos\nsystem\n(" + s0(_cmd(s)) + b"tR."), ".metadata"),
    "metadata STACK_GLOBAL posix.system": (_metadata(lambda s: P4 + b"\x8c\x05posix\x8c\x06system\x93"
                                                     + b"\x8c" + bytes([len(_cmd(s))]) + _cmd(s).encode() + b"\x85R."),
                                           ".metadata"),
    "metadata pickled by pickle.dumps calling os.system": (_metadata(lambda s: pickle.dumps(_System(s))), "system"),
    "metadata SavePlan of eval": (_metadata(_save_plan_calling(b"cbuiltins\neval\n")), "eval"),
    "metadata SavePlan of subprocess.Popen": (_metadata(_save_plan_calling(b"csubprocess\nPopen\n")), "Popen"),
    "metadata MCoreMetadata holding os.system": (_metadata(_mcore_metadata_calling), "system"),
    "metadata BINUNICODE declaring 4 GiB": (_metadata(lambda s: P2 + b"X\xff\xff\xff\xffabc."), ".metadata"),
    "metadata BINBYTES8 declaring 2**62 bytes": (_metadata(lambda s: P4 + b"\x8e" + (1 << 62).to_bytes(8, "little")
                                                           + b"abc."), ".metadata"),
    "metadata LONG4 of 2 GiB": (_metadata(lambda s: P2 + b"\x8b\xff\xff\xff\x7f."), ".metadata"),
    "metadata list of 2**31 from a huge BINPUT": (_metadata(lambda s: P2 + b"]r\xff\xff\xff\x7fh\x00."), ".metadata"),
    # common.pt: the same, in torch.save's zip
    "common.pt calling os.system (torch.save)": (_common_obj(lambda s: {"args": _System(s)}), "common.pt"),
    "common.pt GLOBAL os.system": (_common(lambda s: P2 + b"cos\nsystem\n" + u(_cmd(s)) + b"\x85R."), "common.pt"),
    "common.pt args from eval": (_common(lambda s: P2 + b"}(" + u("args") + b"cbuiltins\neval\n" + u("print(1)")
                                         + b"\x85Ru."), "eval"),
    "common.pt Namespace holding os.system": (_common(_namespace_calling), "system"),
    "common.pt BINUNICODE declaring 4 GiB": (_common(lambda s: P2 + b"X\xff\xff\xff\xffabc."), "common.pt"),
    "common.pt LONG4 of 2 GiB": (_common(lambda s: P2 + b"}(" + u("args") + b"\x8b\xff\xff\xff\x7fu."), "common.pt"),
    "common.pt truncated": (_truncate("common.pt", 0.5), "common.pt"),
    "common.pt random bytes": (_bytes("common.pt", bytes(range(256)) * 8), "common.pt"),
    "common.pt a list": (_common_obj(lambda s: [1, 2]), "common.pt"),
    "common.pt args a list": (_common_obj(lambda s: {"args": [1, 2]}), "common.pt"),
    "common.pt num_layers a string": (_common_obj(lambda s: {"args": _args(num_layers="2")}), "common.pt: "),
    "common.pt num_layers negative": (_common_obj(lambda s: {"args": _args(num_layers=-2)}), "common.pt: "),
    # rank files
    "second rank's file missing": (_remove(RANK1), RANK1),
    "first rank's file missing": (_remove("__0_0.distcp"), "__0_0.distcp"),
    "second rank's file truncated to half": (_truncate(RANK1, 0.5), RANK1),
    "second rank's file truncated to nothing": (_truncate(RANK1, 0.0), RANK1),
    ".metadata missing": (_remove(".metadata"), "ckpt"),
    # the backend
    "metadata.json names zarr": (_backend('{"sharded_backend": "zarr"}'), "zarr"),
    "metadata.json names torch_dist's old name": (_backend('{"sharded_backend": "torch"}'), "'torch' backend"),
    "metadata.json not JSON": (_backend('{"sharded_backend": "torch_dist"'), "metadata.json is not megatron-core's"),
    "metadata.json without a backend": (_backend('{"sharded_backend": 5}'), "metadata.json is not megatron-core's"),
    # the arguments against the tensors
    "stacked axis shorter than num_layers": (_rewrite(_same, _args(num_layers=3)), "num_layers 3"),
    "one stacked tensor with 3 layers": (_rewrite(_stacked(FC2, 3), _args()), FC2),
    "stacked tensors disagree, no args saved": (_rewrite(_stacked(FC2, 3), None), FC2),
    "vocab rows more than padded_vocab_size": (_rewrite(_vocab(10), _args()), "padded_vocab_size 8"),
    "vocab rows fewer than padded_vocab_size": (_rewrite(_vocab(7), _args()), "padded_vocab_size 8"),
    "vocab rows disagree, no vocab_size": (_rewrite(_vocab(10), _args(vocab_size=None)), "padded_vocab_size 8"),
    "vocab_size above padded_vocab_size": (_rewrite(_same, _args(vocab_size=9)),
                                           "common.pt: common.pt's args.vocab_size 9"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_broken_torch_dist_checkpoint_is_refused_in_one_line(good: Path, tmp_path: Path, name: str) -> None:
    edit, words = CASES[name]
    work = tmp_path / "w"
    folder = Path(shutil.copytree(good, work / "ckpt"))
    sentinel = tmp_path / "ran"
    edit(folder, sentinel)
    target = work / "out.safetensors"
    target.write_bytes(b"the previous output")  # kept byte for byte, even with --overwrite
    done = refused(["convert", str(folder), str(target), "--overwrite"], work, words=words, codes=(1,))
    assert str(folder) in done.stderr, done.stderr  # names the checkpoint (its file)
    assert not sentinel.exists(), "a pickle's code ran"


# ---- megatron-core 0.16.1's own checkpoint (2 gloo ranks), broken the same way


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("megatron.core")
    from tests.support.torch_dist import cached_checkpoint

    return cached_checkpoint(tmp_path_factory, "llama")[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["second rank's file missing", "second rank's file truncated to half",
                                  "metadata SavePlan of eval", "common.pt calling os.system (torch.save)",
                                  "common.pt num_layers a string"])
def test_megatron_cores_checkpoint_broken_is_refused(written: Path, tmp_path: Path, name: str) -> None:
    edit, words = CASES[name]
    work = tmp_path / "w"
    folder = Path(shutil.copytree(written, work / "ckpt"))
    if "common.pt" in name and "num_layers" in name:  # megatron's own arguments, one of them broken
        args = torch.load(written / "common.pt", weights_only=False)
        args["args"].num_layers = "2"
        torch.save(args, folder / "common.pt")
    else:
        edit(folder, tmp_path / "ran")
    target = work / "out.safetensors"
    target.write_bytes(b"the previous output")
    refused(["convert", str(folder), str(target), "--overwrite"], work, words=words, codes=(1,))
    assert not (tmp_path / "ran").exists()

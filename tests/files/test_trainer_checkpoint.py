"""A Hugging Face Trainer checkpoint folder as one training checkpoint (`files/trainer.py`).

The oracle is transformers' Trainer itself (`tests/support/trainer_run.py`, in a new process): a tiny Llama
(untied head, RMSNorm) and a tiny GPT-2 (tied head, LayerNorm modules named ln_*, Conv1D) trained
3 steps with AdamW and weight decay (the Trainer's two param groups), saved as checkpoint-3/. Then:

- a Trainer folder migrated by migrator (a straight copy, a recipe renaming there and back, the order
  given by a file instead of transformers) resumed by `Trainer.train(resume_from_checkpoint=...)` for
  one step gives the same parameters and optimizer state, bit for bit, as resuming from the original;
  a control folder whose optimizer.pt has two same-shaped parameters' moments swapped does not;
- a `.pt` target holds, per parameter name, exactly the state the Trainer's optimizer held for that
  parameter in memory, and a `.bpk` target's Burn record the same moments under each param_id;
- an order that cannot be derived, or that contradicts the optimizer, is refused in one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import REPO, migrate_in_process

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
np = pytest.importorskip("numpy")

SUPPORT = REPO / "tests" / "support" / "trainer_run.py"
CKPT = "checkpoint-3"
COMPANIONS = ("scheduler.pt", "trainer_state.json", "rng_state.pth", "training_args.bin", "config.json")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trainer")
    done = subprocess.run([sys.executable, str(SUPPORT), "train", str(out)], capture_output=True, text=True,
                          cwd=out)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _convert(*args: Any) -> subprocess.CompletedProcess[str]:
    done = migrate_in_process("convert", *map(str, args))
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def _refused(*args: Any, words: tuple[str, ...] = ()) -> str:
    done = _convert(*args)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, done.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _resume(tmp_path: Path, kind: str, folders: list[Path]) -> dict[str, Any]:
    out = tmp_path / "resumed.pt"
    done = subprocess.run([sys.executable, str(SUPPORT), "resume", str(out), kind, *map(str, folders)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=True)  # type: ignore[no-any-return]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _swapped_control(src: Path, dst: Path) -> Path:
    """The checkpoint with two same-shaped parameters' moments swapped in optimizer.pt (written by torch)."""
    shutil.copytree(src, dst)
    opt = torch.load(dst / "optimizer.pt", weights_only=True)
    ids = opt["param_groups"][0]["params"]
    shapes = [opt["state"][i]["exp_avg"].shape for i in ids]
    a, b = next((ids[x], ids[y]) for x in range(len(ids)) for y in range(x + 1, len(ids)) if shapes[x] == shapes[y])
    opt["state"][a], opt["state"][b] = opt["state"][b], opt["state"][a]
    torch.save(opt, dst / "optimizer.pt")
    return dst


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_migrated_trainer_folder_resumes_bit_identical(trained: Path, tmp_path: Path, kind: str) -> None:
    src = trained / kind / CKPT
    copy = tmp_path / "copy" / CKPT
    done = _convert(src, f"{copy}/", "--training-state", "keep")
    assert done.returncode == 0, done.stderr
    assert "Trainer's param groups" in done.stdout
    there_and_back = tmp_path / "renamed" / CKPT
    head = "model" if kind == "llama" else "transformer"
    done = _convert(src, f"{there_and_back}/", "--training-state", "keep", "--remap", rf"^{head}\.=backbone.",
                    "--remap", rf"^backbone\.={head}.")
    assert done.returncode == 0, done.stderr
    by_file = tmp_path / "by-file" / CKPT
    done = _convert(src, f"{by_file}/", "--training-state", "keep", "--param-order", trained / kind / "order.pt")
    assert done.returncode == 0, done.stderr
    assert "order.pt" in done.stdout
    # shards past --max-shard-size, then that sharded Trainer folder read as a source in turn
    sharded = tmp_path / "sharded" / CKPT
    done = _convert(src, f"{sharded}/", "--training-state", "keep", "--max-shard-size", "8KB")
    assert done.returncode == 0, done.stderr
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / "model.safetensors").exists()
    again = tmp_path / "again" / CKPT
    done = _convert(sharded, f"{again}/", "--training-state", "keep")
    assert done.returncode == 0, done.stderr
    migrated = (copy, there_and_back, by_file, sharded, again)
    for folder in migrated:
        for name in COMPANIONS:  # the Trainer's own files, byte for byte
            assert (folder / name).read_bytes() == (src / name).read_bytes(), name
    control = _swapped_control(src, tmp_path / "control" / CKPT)

    results = _resume(tmp_path, kind, [src, *migrated, control])
    want = results[str(src)]
    assert int(next(iter(want["optimizer"]["state"].values()))["step"]) == 4  # one more step was taken
    for folder in migrated:
        got = results[str(folder)]
        assert _same(got["params"], want["params"]), folder
        assert _same(got["optimizer"], want["optimizer"]), folder
    # the comparison can fail: moments on the wrong parameters give another step
    assert not _same(results[str(control)]["optimizer"], want["optimizer"])


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_pt_target_holds_the_trainers_optimizer_by_name(trained: Path, tmp_path: Path, kind: str) -> None:
    src = trained / kind / CKPT
    out = tmp_path / "whole.pt"
    head = "model" if kind == "llama" else "transformer"
    done = _convert(src, out, "--training-state", "keep", "--top-level-key", "model", "--remap",
                    rf"^{head}\.=backbone.")
    assert done.returncode == 0, done.stderr
    oracle = torch.load(trained / kind / "oracle.pt", weights_only=True)
    ckpt = torch.load(out, weights_only=True)
    renamed = {n: n.replace(f"{head}.", "backbone.", 1) if n.startswith(f"{head}.") else n
               for g in oracle["groups"] for n in g}
    # each parameter in the group the Trainer put it in (the .pt lists them in the output's order, by name)
    assert [sorted(g["param_names"]) for g in ckpt["optimizer"]["param_groups"]] == [
        sorted(renamed[n] for n in g) for g in oracle["groups"]]
    by_name = {name: ckpt["optimizer"]["state"][i] for g in ckpt["optimizer"]["param_groups"]
               for i, name in zip(g["params"], g["param_names"], strict=True)}
    assert len(by_name) == len(oracle["state"])
    for name, state in oracle["state"].items():
        assert _same(by_name[renamed[name]], state), name
    weights = torch.load(trained / kind / "order.pt", weights_only=True)
    assert set(ckpt["model"]) == {renamed[n] for n in weights}
    for n, p in weights.items():
        assert torch.equal(ckpt["model"][renamed[n]], p)


def test_pt_target_of_the_same_model_keeps_the_trainers_order(trained: Path, tmp_path: Path) -> None:
    """With the source's parameters, the .pt's ids are in the Trainer's order: the optimizer the Trainer
    builds for the model loads it by position and finds each parameter's own state."""
    from transformers import Trainer, TrainingArguments

    from tests.support.trainer_run import _model
    out = tmp_path / "whole.pt"
    done = _convert(trained / "llama" / CKPT, out, "--training-state", "keep")
    assert done.returncode == 0, done.stderr
    oracle = torch.load(trained / "llama" / "oracle.pt", weights_only=True)
    ckpt = torch.load(out, weights_only=True)
    assert [g["param_names"] for g in ckpt["optimizer"]["param_groups"]] == oracle["groups"]
    model = _model("llama")
    model.load_state_dict(ckpt["model"])
    args = TrainingArguments(output_dir=str(tmp_path / "t"), use_cpu=True, weight_decay=0.1, report_to=[])
    opt = Trainer(model=model, args=args).create_optimizer()
    opt.load_state_dict(ckpt["optimizer"])
    for name, p in model.named_parameters():
        assert _same(opt.state[p], oracle["state"][name]), name


def test_burn_record_holds_the_trainers_moments(trained: Path, tmp_path: Path) -> None:
    from migrator import open_file

    src = trained / "llama" / CKPT
    done = _convert(src, tmp_path / "model.bpk", "--training-state", "keep", "--top-level-key", "model")
    assert done.returncode == 0, done.stderr
    oracle = torch.load(trained / "llama" / "oracle.pt", weights_only=True)
    with open_file(tmp_path / "model.bpk") as model, open_file(tmp_path / "model-optim.bpk") as record:
        ids = {t.name: t.param_id for t in model.tensors}
        assert set(ids) == set(oracle["state"])
        for name, state in oracle["state"].items():
            for key, field in (("exp_avg", "moment_1"), ("exp_avg_sq", "moment_2")):
                got = record[f"{ids[name]}.momentum.{field}"].numpy()
                assert np.array_equal(got, state[key].numpy()), (name, key)


def _variant(src: Path, dst: Path, **config: Any) -> Path:
    """The checkpoint with config.json entries changed (None: removed)."""
    shutil.copytree(src, dst)
    data = json.loads((dst / "config.json").read_text())
    for k, v in config.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    (dst / "config.json").write_text(json.dumps(data))
    return dst


def test_an_order_that_cannot_be_derived_is_refused(trained: Path, tmp_path: Path) -> None:
    src = trained / "llama" / CKPT
    out = tmp_path / "out.pt"
    unknown = _variant(src, tmp_path / "unknown" / CKPT, architectures=["NotATransformersModel"])
    _refused(unknown, out, "--training-state", "keep",
             words=("optimizer.pt", "NotATransformersModel", "--param-order", "training_state: drop"))
    nameless = _variant(src, tmp_path / "nameless" / CKPT, architectures=None)
    _refused(nameless, out, "--training-state", "keep", words=("no single architecture", "--param-order"))
    assert not out.exists()


def test_without_transformers_the_order_is_asked_for(trained: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails: not installed
    out = tmp_path / "out.pt"
    line = _refused(trained / "llama" / CKPT, out, "--training-state", "keep",
                    words=("transformers is not installed", "--param-order", "migrator[trainer]"))
    assert line.startswith("migrate: error:")
    assert not out.exists()
    # the order given by a file needs no transformers
    done = _convert(trained / "llama" / CKPT, out, "--training-state", "keep", "--param-order",
                    trained / "llama" / "order.pt")
    assert done.returncode == 0, done.stderr


def test_an_order_that_contradicts_the_optimizer_is_refused(trained: Path, tmp_path: Path) -> None:
    src = trained / "llama" / CKPT
    out = tmp_path / "out" / CKPT
    # another architecture than the one trained: the groups' sizes disagree
    fewer = _variant(src, tmp_path / "fewer" / CKPT, num_hidden_layers=1)
    _refused(fewer, f"{out}/", "--training-state", "keep", words=("param groups hold [16, 5]", "--param-order"))
    # model.safetensors' own (sorted) order is not the model's: no split of it fits the moments' shapes
    _refused(src, f"{out}/", "--training-state", "keep", "--param-order", src / "model.safetensors",
             words=("fits no split", "model.safetensors"))
    # a file listing fewer parameters than the optimizer holds
    order = torch.load(trained / "llama" / "order.pt", weights_only=True)
    torch.save(dict(list(order.items())[:-1]), tmp_path / "short.pt")
    _refused(src, f"{out}/", "--training-state", "keep", "--param-order", tmp_path / "short.pt",
             words=("lists 20 of the model's tensors", "21 parameters"))
    assert not out.exists()


def test_param_order_applies_to_trainer_folders_only(trained: Path, tmp_path: Path) -> None:
    src = trained / "llama" / CKPT
    _refused(src / "model.safetensors", tmp_path / "out.safetensors", "--param-order",
             trained / "llama" / "order.pt", words=("applies only to a Hugging Face Trainer checkpoint",))


def test_without_keep_the_folder_is_its_model(trained: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    src = trained / "llama" / CKPT
    done = _convert(src, tmp_path / "model.safetensors")
    assert done.returncode == 0, done.stderr
    assert _same(load_file(tmp_path / "model.safetensors"), load_file(src / "model.safetensors"))
    shown = migrate_in_process("inspect", str(src), "--limit", "1")  # says what is left out, and how to keep it
    assert shown.returncode == 0, shown.stderr
    assert "note: a Hugging Face Trainer checkpoint: only its model is read" in shown.stdout
    assert "--training-state keep" in shown.stdout


def _section(doc: str, title: str) -> str:
    start = doc.index(f"## {title}\n")
    end = doc.find("\n## ", start + 1)
    return doc[start:end if end >= 0 else None]


def test_the_docs_trainer_commands_run(trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import shlex

    from tests.support.trainer_run import _model
    doc = (REPO / "docs" / "training-checkpoints.md").read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", _section(doc, "Hugging Face Trainer checkpoints"), re.S)
    assert [kind for kind, _ in blocks] == ["sh", "python", "sh"]
    shutil.copytree(trained / "llama" / CKPT, tmp_path / CKPT)
    monkeypatch.chdir(tmp_path)
    for kind, body in blocks:
        if kind == "python":
            exec(body, {"torch": torch, "model": _model("llama")})
            continue
        for line in body.strip().splitlines():
            args = shlex.split(line, comments=True)
            assert args[0] == "migrate"
            done = migrate_in_process(*args[1:])
            assert done.returncode == 0, (line, done.stderr)
    assert (tmp_path / "migrated" / CKPT / "optimizer.pt").is_file()
    assert (tmp_path / "model-optim.bpk").is_file()
    assert "backbone.embed_tokens.weight" in torch.load(tmp_path / "renamed.pt", weights_only=True)["model"]
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)  # the last: the order given by order.pt
    assert len(whole["optimizer"]["param_groups"]) == 2


PHI3_TO_LLAMA = r"""
version: 1
source: {path: phi3/checkpoint-3}
training_state: keep
ops:
  - split: {from: '(model\.layers\.\d+)\.self_attn\.qkv_proj\.weight', dim: 0, parts: 3,
            to: ['$1.self_attn.q_proj.weight', '$1.self_attn.k_proj.weight', '$1.self_attn.v_proj.weight']}
  - split: {from: '(model\.layers\.\d+)\.mlp\.gate_up_proj\.weight', dim: 0, parts: 2,
            to: ['$1.mlp.gate_proj.weight', '$1.mlp.up_proj.weight']}
target: {path: llama/checkpoint-3/, copy_from: llama-config, copy: [config.json]}
"""


def test_a_new_model_gets_its_own_trainer_order(trained: Path, tmp_path: Path) -> None:
    """Phi-3 (o_proj declared before the fused qkv_proj) split into Llama's q/k/v and gate/up: the
    Trainer folder's optimizer.pt is numbered in Llama's order, so the optimizer the Trainer builds for a
    Llama loads it by position and finds each parameter's moments: the split of Phi-3's, in torch."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    shutil.copytree(trained / "phi3", tmp_path / "phi3")
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                         tie_word_embeddings=False)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(tmp_path / "llama-config")
    (tmp_path / "recipe.yaml").write_text(PHI3_TO_LLAMA)
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "llama" / CKPT
    assert (out / "scheduler.pt").read_bytes() == (tmp_path / "phi3" / CKPT / "scheduler.pt").read_bytes()

    llama = LlamaForCausalLM.from_pretrained(out)
    args = TrainingArguments(output_dir=str(tmp_path / "t"), use_cpu=True, weight_decay=0.1, report_to=[])
    opt = Trainer(model=llama, args=args).create_optimizer()
    opt.load_state_dict(torch.load(out / "optimizer.pt", weights_only=True))  # by position, as resuming does

    phi3 = torch.load(trained / "phi3" / "oracle.pt", weights_only=True)["state"]
    weights = load_file(tmp_path / "phi3" / CKPT / "model.safetensors")
    parts = {"q_proj": ("self_attn.qkv_proj", 3, 0), "k_proj": ("self_attn.qkv_proj", 3, 1),
             "v_proj": ("self_attn.qkv_proj", 3, 2), "gate_proj": ("mlp.gate_up_proj", 2, 0),
             "up_proj": ("mlp.gate_up_proj", 2, 1)}

    def surgery(name: str, value: Any) -> Any:  # the split, done in torch
        module = name.split(".")[-2]
        if module not in parts or value.dim() == 0:
            return value
        _, n, i = parts[module]
        return value.chunk(n, dim=0)[i]

    def source(name: str) -> str:
        module = name.split(".")[-2]
        if module not in parts:
            return name
        return name.replace(f"{name.split('.')[-3]}.{module}", parts[module][0])

    checked = 0
    for name, p in llama.named_parameters():
        assert torch.equal(p.detach(), surgery(name, weights[source(name)])), name
        state = opt.state[p]
        want = phi3[source(name)]
        assert set(state) == set(want), name
        for key in want:
            assert _same(state[key], surgery(name, want[key])), (name, key)
        checked += 1
    assert checked == len(list(llama.parameters())) == 21


def test_a_new_model_without_its_config_is_refused(trained: Path, tmp_path: Path) -> None:
    shutil.copytree(trained / "phi3", tmp_path / "phi3")
    (tmp_path / "recipe.yaml").write_text(PHI3_TO_LLAMA.replace(", copy_from: llama-config, copy: [config.json]", ""))
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 1, done.stdout
    assert "--copy-from NEW_MODEL_DIR --copy config.json" in done.stderr
    assert not (tmp_path / "llama").exists()


@pytest.mark.parametrize(("broken", "said"), [
    ("not a dict", "not an optimizer state_dict"),
    ("names as ids", "param_groups[0].params is not a list of parameter ids"),
    ("a moment of another shape", "optimizer.pt's state 0 'exp_avg' has shape [3, 3]"),
])
def test_a_broken_optimizer_pt_is_refused(trained: Path, tmp_path: Path, broken: str, said: str) -> None:
    folder = tmp_path / CKPT
    shutil.copytree(trained / "llama" / CKPT, folder)
    opt = torch.load(folder / "optimizer.pt", weights_only=True)
    if broken == "not a dict":
        opt = [1, 2]
    elif broken == "names as ids":
        opt["param_groups"][0]["params"] = ["a", "b"]
    else:
        opt["state"][0]["exp_avg"] = torch.zeros(3, 3)
    torch.save(opt, folder / "optimizer.pt")
    _refused(folder, tmp_path / "out.pt", "--training-state", "keep", words=(said,))
    assert not (tmp_path / "out.pt").exists()


def test_a_split_the_shapes_do_not_decide_is_refused(tmp_path: Path) -> None:
    """Two parameters of one shape, one per group: either could be in either group."""
    from safetensors.torch import save_file

    from migrator.core.errors import FormatError
    from migrator.files.trainer_order import parameter_order

    save_file({"a": torch.zeros(4), "b": torch.zeros(4)}, tmp_path / "order.safetensors")
    with pytest.raises(FormatError, match="several ways"):
        parameter_order(tmp_path, {"a": (4,), "b": (4,)}, [1, 1], [{"exp_avg": (4,)}, {"exp_avg": (4,)}],
                        str(tmp_path), tmp_path / "order.safetensors")
    # one shape apart: one split fits, and it is found
    save_file({"a": torch.zeros(4), "b": torch.zeros(2, 2)}, tmp_path / "order.safetensors")
    order = parameter_order(tmp_path, {"a": (4,), "b": (2, 2)}, [1, 1], [{"exp_avg": (2, 2)}, {"exp_avg": (4,)}],
                            str(tmp_path), tmp_path / "order.safetensors")
    assert order.groups == [["b"], ["a"]]


def test_emit_recipe_keeps_the_param_order_file(trained: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe --emit-recipe -o writes finds the order file from its own folder, as it reads paths."""
    shutil.copytree(trained / "llama", tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    done = _convert("run/checkpoint-3", "out/whole.pt", "--training-state", "keep", "--param-order",
                    "run/order.pt", "--emit-recipe", "-o", "recipes/trainer.yaml")
    assert done.returncode == 0, done.stderr
    first = torch.load(tmp_path / "out" / "whole.pt", weights_only=True)
    again = migrate_in_process("run", "recipes/trainer.yaml", "--target", "again.pt")
    assert again.returncode == 0, again.stderr
    assert "../run/order.pt" in (tmp_path / "recipes" / "trainer.yaml").read_text()
    assert _same(torch.load(tmp_path / "again.pt", weights_only=True), first)


def test_the_plan_names_where_each_moment_is_written(trained: Path, tmp_path: Path) -> None:
    """`plan --json` lists each moment's place in the written optimizer.pt (its id in the Trainer's order)."""
    shutil.copytree(trained / "llama", tmp_path / "llama")
    (tmp_path / "recipe.yaml").write_text("version: 1\nsource: {path: llama/checkpoint-3}\ntraining_state: keep\n"
                                          "target: {path: out/checkpoint-3/}\n")
    shown = migrate_in_process("plan", str(tmp_path / "recipe.yaml"), "--json")
    assert shown.returncode == 0, shown.stderr
    fates = json.loads(shown.stdout)["report"]["optimizer"]
    done = migrate_in_process("run", str(tmp_path / "recipe.yaml"))
    assert done.returncode == 0, done.stderr
    written = torch.load(tmp_path / "out" / CKPT / "optimizer.pt", weights_only=True)
    oracle = torch.load(trained / "llama" / "oracle.pt", weights_only=True)["state"]
    assert len(fates) == 3 * len(oracle)
    for fate in fates:
        _, _, pid, key = fate["tensor"].split(".")
        assert _same(written["state"][int(pid)][key], oracle[fate["param"]][key]), fate

"""Several sources in one recipe (`sources:`): grafts of real transformers BERTs, checked with torch."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


def migrate(*args: str) -> subprocess.CompletedProcess[str]:
    """`migrate ARGS` in this process."""
    from migrator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = int(e.code or 0)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def config(layers: int = 2) -> object:
    return transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                                   intermediate_size=24, max_position_embeddings=16, num_labels=3)


def seeded(cls: type, seed: int, layers: int = 2) -> object:
    torch.manual_seed(seed)
    return cls(config(layers)).eval()


@pytest.fixture
def graft(tmp_path: Path) -> dict[str, object]:
    """Three tiny BERTs on disk: a BertModel (the encoder donor), a classifier (the head donor), a template."""
    donor = seeded(transformers.BertModel, 1)
    head = seeded(transformers.BertForSequenceClassification, 2)
    template = seeded(transformers.BertForSequenceClassification, 3)
    safetensors_torch.save_file(donor.state_dict(), tmp_path / "a.safetensors")
    torch.save(head.state_dict(), tmp_path / "b.pt")
    safetensors_torch.save_file(template.state_dict(), tmp_path / "init.safetensors")
    return {"donor": donor, "head": head, "template": template}


GRAFT = """\
version: 1
sources:
  - name: encoder
    path: a.safetensors
    filter: {include: [{regex: '^encoder\\.'}]}
    prefix: bert.
  - name: head
    path: b.pt
    filter: {include: [{regex: '^classifier\\.'}]}
target: {path: out.safetensors, template: init.safetensors}
allow_partial: true
"""


def test_graft_encoder_and_head_into_template(tmp_path: Path, graft: dict[str, object]) -> None:
    (tmp_path / "r.yaml").write_text(GRAFT)
    p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress", "--report", str(tmp_path / "rep.json"))
    assert p.returncode == 0, p.stderr
    out = seeded(transformers.BertForSequenceClassification, 99)
    out.load_state_dict(safetensors_torch.load_file(tmp_path / "out.safetensors"), strict=True)
    got = out.state_dict()
    donor = graft["donor"].state_dict()  # type: ignore[attr-defined]
    head = graft["head"].state_dict()  # type: ignore[attr-defined]
    template = graft["template"].state_dict()  # type: ignore[attr-defined]
    encoder = [k for k in got if k.startswith("bert.encoder.")]
    assert encoder and all(torch.equal(got[k], donor[k.removeprefix("bert.")]) for k in encoder)
    assert torch.equal(got["classifier.weight"], head["classifier.weight"])
    assert torch.equal(got["classifier.bias"], head["classifier.bias"])
    rest = [k for k in got if not k.startswith(("bert.encoder.", "classifier."))]
    assert rest and all(torch.equal(got[k], template[k]) for k in rest)
    report = json.loads((tmp_path / "rep.json").read_text())
    assert {e["from"] for e in report["tensors"]} == {"encoder", "head"}
    skipped = {(e["source"], e["tensor"]) for e in report["skipped_from"]}
    assert ("encoder", "pooler.dense.weight") in skipped and ("head", "bert.pooler.dense.weight") in skipped
    assert [e["path"] for e in report["skipped_from"]] == report["skipped"]


def test_plan_shows_a_source_column(tmp_path: Path, graft: dict[str, object]) -> None:
    (tmp_path / "r.yaml").write_text(GRAFT)
    p = migrate("plan", str(tmp_path / "r.yaml"), "--json")
    doc = json.loads(p.stdout)
    by_target = {e["target"]: e for e in doc["entries"]}
    assert by_target["classifier.bias"]["from"] == "head"
    assert by_target["bert.encoder.layer.0.output.dense.bias"]["from_tensor"] == "encoder.layer.0.output.dense.bias"
    assert [s["name"] for s in doc["sources"]] == ["encoder", "head"]
    text = migrate("plan", str(tmp_path / "r.yaml")).stdout
    assert "from" in text.splitlines()[1] or "from" in text


CLASH = """\
version: 1
sources:
  - name: encoder
    path: a.safetensors
    remap: [{from: '^encoder\\.layer\\.0\\.output\\.dense\\.bias$', to: classifier.bias}]
  - name: head
    path: b.pt
    filter: {include: [{regex: '^classifier\\.'}]}
target: {path: out.safetensors}
"""


def test_two_sources_giving_one_name_is_an_error(tmp_path: Path, graft: dict[str, object]) -> None:
    (tmp_path / "r.yaml").write_text(CLASH)
    p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 1
    assert "two sources give the same name: 'classifier.bias' <- 'encoder.layer.0.output.dense.bias' of source " \
           f"'encoder' ({tmp_path / 'r.yaml'}:3:5) and 'classifier.bias' of source 'head' ({tmp_path / 'r.yaml'}:6:5)" \
           in p.stderr
    assert not (tmp_path / "out.safetensors").exists()


def test_global_remap_clash_names_both_sources(tmp_path: Path, graft: dict[str, object]) -> None:
    (tmp_path / "r.yaml").write_text(GRAFT + "remap: [{from: '^bert\\.encoder\\.layer\\.0\\.output\\.dense\\.bias$',"
                                     " to: 'classifier.bias'}]\n")
    p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 1
    assert "'encoder.layer.0.output.dense.bias' of source 'encoder'" in p.stderr
    assert "'classifier.bias' of source 'head'" in p.stderr


def test_source_key_rules(tmp_path: Path) -> None:
    from migrator.recipe_loader import RecipeError, parse_recipe

    with pytest.raises(RecipeError, match="give source or sources, not both"):
        parse_recipe("version: 1\nsource: {path: a.pt}\nsources: [{path: b.pt}]\ntarget: {path: o.bpk}\n")
    with pytest.raises(RecipeError, match="reads nothing"):
        parse_recipe("version: 1\ntarget: {path: o.bpk}\n")
    with pytest.raises(RecipeError, match="two sources are called 'a.pt'") as e:
        parse_recipe("version: 1\nsources: [{path: a.pt}, {path: a.pt}]\ntarget: {path: o.bpk}\n")
    assert ":2:" in str(e.value)
    with pytest.raises(RecipeError, match="same file as sources\\[1\\].path"):
        parse_recipe("version: 1\nsources: [{path: a.pt}, {path: o.safetensors}]\ntarget: {path: o.safetensors}\n",
                     base_dir=tmp_path)


def test_source_override_needs_a_name(tmp_path: Path, graft: dict[str, object]) -> None:
    (tmp_path / "r.yaml").write_text(GRAFT)
    p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress", "--source", str(tmp_path / "a.safetensors"))
    assert p.returncode == 2 and "this recipe has 2 sources: --source needs NAME=PATH" in p.stderr
    assert "'encoder', 'head'" in p.stderr
    other = seeded(transformers.BertForSequenceClassification, 7)
    torch.save(other.state_dict(), tmp_path / "c.pt")
    p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress", "--source", f"head={tmp_path / 'c.pt'}")
    assert p.returncode == 0, p.stderr
    got = safetensors_torch.load_file(tmp_path / "out.safetensors")
    assert torch.equal(got["classifier.weight"], other.state_dict()["classifier.weight"])


def test_output_may_not_be_a_source_by_inode(tmp_path: Path, graft: dict[str, object]) -> None:
    (tmp_path / "link.safetensors").hardlink_to(tmp_path / "a.safetensors")
    before = (tmp_path / "a.safetensors").read_bytes()
    (tmp_path / "r.yaml").write_text(GRAFT.replace("out.safetensors", "link.safetensors") + "\n")
    p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress", "--overwrite")
    assert p.returncode != 0
    assert (tmp_path / "a.safetensors").read_bytes() == before


def test_hash_sources_per_source(tmp_path: Path, graft: dict[str, object]) -> None:
    import hashlib

    (tmp_path / "r.yaml").write_text(GRAFT)
    assert migrate("run", str(tmp_path / "r.yaml"), "--no-progress", "--hash-sources").returncode == 0
    with open(tmp_path / "out.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    table = json.loads(header["__metadata__"]["migrator.sources_sha256"])
    assert table == {"encoder": {"a.safetensors": hashlib.sha256((tmp_path / "a.safetensors").read_bytes()).hexdigest()},
                     "head": {"b.pt": hashlib.sha256((tmp_path / "b.pt").read_bytes()).hexdigest()}}

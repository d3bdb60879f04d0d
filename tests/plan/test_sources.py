"""Several sources in one recipe (`sources:`): grafts of real transformers BERTs, checked with torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import migrate_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


migrate = migrate_in_process


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
    from migrator.recipe.loader import RecipeError, parse_recipe

    with pytest.raises(RecipeError, match="give source or sources, not both"):
        parse_recipe("version: 1\nsource: {path: a.pt}\nsources: [{path: b.pt}]\ntarget: {path: o.bpk}\n")
    with pytest.raises(RecipeError, match="reads nothing"):
        parse_recipe("version: 1\ntarget: {path: o.bpk}\n")
    with pytest.raises(RecipeError, match=r"two sources are called 'a\.pt'") as e:
        parse_recipe("version: 1\nsources: [{path: a.pt}, {path: a.pt}]\ntarget: {path: o.bpk}\n")
    assert ":2:" in str(e.value)
    with pytest.raises(RecipeError, match=r"same file as sources\[1\]\.path"):
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
    def digest(name: str) -> str:
        return hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()

    assert table == {"encoder": {"a.safetensors": digest("a.safetensors")}, "head": {"b.pt": digest("b.pt")}}


def _bert_model_equal(got: dict[str, object], want: dict[str, object]) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k  # type: ignore[arg-type]


CUT = r"""version: 1
sources:
  - path: big.safetensors
    filter: {include: [{regex: '^encoder\.layer\.(1[2-9]|2[0-3])\.'}, {regex: '^(embeddings|pooler)\.'}]}
    remap: [{from: '^encoder\.layer\.(\d+)\.', to: 'encoder.layer.${1-12}.'}]
target: {path: top.safetensors}
"""


def test_cut_24_layers_to_the_top_12(tmp_path: Path) -> None:
    big = seeded(transformers.BertModel, 5, layers=24)
    safetensors_torch.save_file(big.state_dict(), tmp_path / "big.safetensors")
    (tmp_path / "r.yaml").write_text(CUT)
    p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 0, p.stderr
    small = seeded(transformers.BertModel, 6, layers=12)
    small.load_state_dict(safetensors_torch.load_file(tmp_path / "top.safetensors"), strict=True)
    # the oracle: transformers' own model with layers 12..23 of the big one as its encoder
    big.encoder.layer = big.encoder.layer[12:]
    _bert_model_equal(small.state_dict(), big.state_dict())


STACK = r"""version: 1
sources:
  - {name: lower, path: a.safetensors}
  - name: upper
    path: b.bin
    contiguous_indices: false   # a PyTorch file renumbers from 0 by default: the remap places these layers
    filter: {include: [{regex: '^encoder\.layer\.'}]}
    remap: [{from: '^encoder\.layer\.(\d+)\.', to: 'encoder.layer.${1+6}.'}]
target: {path: stacked.safetensors}
"""


def test_stack_two_6_layer_models_into_12(tmp_path: Path) -> None:
    lower, upper = seeded(transformers.BertModel, 8, layers=6), seeded(transformers.BertModel, 9, layers=6)
    safetensors_torch.save_file(lower.state_dict(), tmp_path / "a.safetensors")
    torch.save(upper.state_dict(), tmp_path / "b.bin")
    (tmp_path / "r.yaml").write_text(STACK)
    p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 0, p.stderr
    stacked = seeded(transformers.BertModel, 10, layers=12)
    stacked.load_state_dict(safetensors_torch.load_file(tmp_path / "stacked.safetensors"), strict=True)
    lower.encoder.layer.extend(upper.encoder.layer)  # the oracle, built by torch
    _bert_model_equal(stacked.state_dict(), lower.state_dict())
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(stacked(ids).last_hidden_state, lower(ids).last_hidden_state)


def test_negative_index_names_the_tensor(tmp_path: Path) -> None:
    big = seeded(transformers.BertModel, 5, layers=2)
    safetensors_torch.save_file(big.state_dict(), tmp_path / "big.safetensors")
    (tmp_path / "r.yaml").write_text(CUT.replace("(1[2-9]|2[0-3])", r"\d+"))
    p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 1 and not (tmp_path / "top.safetensors").exists()
    assert "${1-12} on tensor 'encoder.layer.0.attention.output.LayerNorm.bias' gives -12 (group 1 is '0'): an index " \
           "cannot be negative" in p.stderr


def test_non_numeric_group_names_the_tensor(tmp_path: Path) -> None:
    big = seeded(transformers.BertModel, 5, layers=2)
    safetensors_torch.save_file(big.state_dict(), tmp_path / "big.safetensors")
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: big.safetensors}\nremap: [{from: "
                                     "'^pooler\\.(\\w+)\\.', to: 'pooler.${1+1}.'}]\ntarget: {path: o.safetensors}\n")
    p = migrate("run", str(tmp_path / "r.yaml"), "--no-progress")
    assert p.returncode == 1
    assert "${1+1} on tensor 'pooler.dense.bias': group 1 is 'dense', not a number" in p.stderr


def test_hash_sources_of_a_sharded_source_lists_every_shard(tmp_path: Path) -> None:
    import hashlib

    model = seeded(transformers.BertModel, 4, layers=2)
    model.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    shards = sorted(p.name for p in (tmp_path / "hf").glob("model-*.safetensors"))
    assert len(shards) >= 2
    (tmp_path / "r.yaml").write_text("version: 1\nsource: {path: hf}\ntarget: {path: out.bpk}\n")
    assert migrate("run", str(tmp_path / "r.yaml"), "--no-progress", "--hash-sources").returncode == 0
    from migrator import open_file

    with open_file(tmp_path / "out.bpk") as bpk:
        table = json.loads(bpk.metadata["migrator.source_files_sha256"])
        assert "migrator.source_sha256" not in bpk.metadata
    files = ["model.safetensors.index.json", *shards]
    assert table == {f: hashlib.sha256((tmp_path / "hf" / f).read_bytes()).hexdigest() for f in files}


def test_diff_with_a_sources_recipe(tmp_path: Path, graft: dict[str, object]) -> None:
    (tmp_path / "r.yaml").write_text(GRAFT)
    assert migrate("run", str(tmp_path / "r.yaml"), "--no-progress").returncode == 0
    out = str(tmp_path / "out.safetensors")
    p = migrate("diff", str(tmp_path / "a.safetensors"), out, "--recipe", str(tmp_path / "r.yaml"), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["summary"]["identical"] > 0
    other = seeded(transformers.BertForSequenceClassification, 7)
    torch.save(other.state_dict(), tmp_path / "c.pt")  # another head: the output no longer matches
    p = migrate("diff", f"head={tmp_path / 'c.pt'}", out, "--recipe", str(tmp_path / "r.yaml"), "--json")
    assert p.returncode == 1
    p = migrate("diff", str(tmp_path / "c.pt"), out, "--recipe", str(tmp_path / "r.yaml"))
    assert p.returncode != 0 and "none of the recipe's sources ('encoder', 'head')" in p.stderr

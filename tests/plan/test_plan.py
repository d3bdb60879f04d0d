"""Planner and executor end to end on generated files: names, filters, templates, report, atomicity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migrator import from_numpy, open_file, save
from migrator.core.errors import PlanError, TargetExistsError
from migrator.core.scalars import Scalar
from migrator.plan.build import RecipeFile, build_plan
from migrator.recipe.model import Recipe
from migrator.run.execute import MigrationError, run_plan


def recipe(**data: Any) -> Recipe:
    data.setdefault("version", 1)
    return Recipe.model_validate(data)


def arr(*shape: int, start: float = 0.0) -> np.ndarray:
    return (np.arange(int(np.prod(shape)), dtype=np.float32) + start).reshape(shape)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "src.safetensors"
    save([from_numpy("model.enc.0.weight", arr(2, 3)), from_numpy("model.enc.0.bias", arr(2, start=10)),
          from_numpy("model.enc.2.weight", arr(2, 2, start=20)), from_numpy("model.head.weight", arr(4, start=30)),
          from_numpy("model.bn.num_batches_tracked", np.array(5, np.int64))], path)
    return path


def run(r: Recipe, base: Path, **kw: Any) -> tuple[Any, str]:
    with build_plan(r, base, **kw) as plan:
        return plan, run_plan(plan, progress=False).target


def test_remap_indices_filter_and_source_order(src: Path, tmp_path: Path) -> None:
    r = recipe(source={"path": src.name, "contiguous_indices": True},
               remap=[{"from": r"^model\.", "to": ""}, {"from": r"^enc\.(\d+)\.", "to": "encoder.layers.$1."}],
               filter={"exclude": [{"regex": r"num_batches_tracked$"}]},
               target={"path": "out.safetensors"})
    plan, out = run(r, tmp_path)
    assert plan.report.skipped == ["bn.num_batches_tracked"]
    # source data order (SafeTensors files are sorted by dtype, then name)
    assert plan.report.applied == ["encoder.layers.0.bias", "encoder.layers.0.weight", "encoder.layers.1.weight",
                                   "head.weight"]
    entry = next(e for e in plan.entries if e.target == "encoder.layers.1.weight")
    assert entry.source == "model.enc.2.weight"
    assert list(entry.ops) == ["remap model.enc.2.weight -> encoder.layers.2.weight",
                         "index encoder.layers.2.weight -> encoder.layers.1.weight"]
    with open_file(out) as r_out:
        np.testing.assert_array_equal(r_out["encoder.layers.1.weight"].numpy(), arr(2, 2, start=20))
        assert r_out.metadata == {}  # same format: the source's (empty) metadata, nothing added


def test_include_by_regex_path_and_predicate(src: Path, tmp_path: Path) -> None:
    r = recipe(source={"path": str(src)},
               filter={"include": [{"regex": r"head"}, {"path": "model.enc.0.weight"},
                                   {"predicate": "tests.support.predicates:keep_bias"}]},
               target={"path": "o.bpk"})
    plan, _ = run(r, tmp_path)
    assert plan.report.applied == ["model.enc.0.bias", "model.enc.0.weight", "model.head.weight"]
    assert plan.report.skipped == ["model.bn.num_batches_tracked", "model.enc.2.weight"]


def test_collision_after_remap_names_both_sources(src: Path, tmp_path: Path) -> None:
    r = recipe(source={"path": str(src)}, remap=[{"from": r"\.\d+\.", "to": "."}], target={"path": "o.bpk"})
    with pytest.raises(PlanError, match=r"'model\.enc\.weight' <- 'model\.enc\.0\.weight', 'model\.enc\.2\.weight'"):
        build_plan(r, tmp_path)


@pytest.fixture
def template(tmp_path: Path) -> Path:
    path = tmp_path / "template.bpk"
    save([from_numpy("enc.0.weight", np.zeros((2, 3), np.float32), param_id=11),
          from_numpy("enc.0.bias", np.zeros(2, np.float32), param_id=12),
          from_numpy("enc.1.weight", np.zeros((2, 2), np.float32), param_id=13),
          from_numpy("decoder.weight", np.full(3, 7, np.float32), param_id=14)], path)
    return path


def test_template_missing_is_fatal_without_allow_partial(src: Path, template: Path, tmp_path: Path) -> None:
    r = recipe(source={"path": str(src), "contiguous_indices": True}, remap=[{"from": r"^model\.", "to": ""}],
               target={"path": "o.bpk", "template": template.name})
    with build_plan(r, tmp_path) as plan:
        assert plan.report.missing == [("decoder.weight", "")]
        assert plan.report.unused == ["bn.num_batches_tracked", "head.weight"]
        assert plan.fatal and "allow_partial" in plan.fatal[0]
        text = plan.report.display()
        assert "✗ Missing in source:    1 tensor" in text and "decoder.weight" in text
        with pytest.raises(MigrationError, match="no source"):
            run_plan(plan, progress=False)
    assert not (tmp_path / "o.bpk").exists()


def test_template_partial_keeps_values_ids_and_order(src: Path, template: Path, tmp_path: Path) -> None:
    r = recipe(source={"path": str(src), "contiguous_indices": True}, remap=[{"from": r"^model\.", "to": ""}],
               target={"path": "o.bpk", "template": str(template)}, allow_partial=True)
    plan, out = run(r, tmp_path)
    assert plan.report.applied == ["enc.0.weight", "enc.0.bias", "enc.1.weight"]
    with open_file(out) as o:
        assert o.names() == ["enc.0.weight", "enc.0.bias", "enc.1.weight", "decoder.weight"]
        assert [t.param_id for t in o.tensors] == [11, 12, 13, 14]
        np.testing.assert_array_equal(o["decoder.weight"].numpy(), np.full(3, 7, np.float32))
        np.testing.assert_array_equal(o["enc.1.weight"].numpy(), arr(2, 2, start=20))


def test_shape_mismatch_fatal_when_validating_reported_otherwise(tmp_path: Path) -> None:
    save([from_numpy("w", arr(3, 3))], tmp_path / "s.safetensors")
    save([from_numpy("w", np.ones((2, 2), np.float32), param_id=1)], tmp_path / "t.bpk")
    base = {"source": {"path": "s.safetensors"}, "target": {"path": "o.bpk", "template": "t.bpk"}}
    with build_plan(recipe(**base), tmp_path) as plan:
        assert plan.report.errors[0].kind == "shape_mismatch"
        assert "Shape mismatch for 'w': expected [2, 2], found [3, 3] in source tensor 'w'" in plan.fatal
    plan, out = run(recipe(**base, validate=False), tmp_path)
    assert len(plan.report.errors) == 1
    np.testing.assert_array_equal(open_file(out)["w"].numpy(), np.ones((2, 2), np.float32))


def test_enum_variants_skipped_when_matching_template(tmp_path: Path) -> None:
    save([from_numpy("feature.weight", arr(2))], tmp_path / "s.safetensors")
    save([from_numpy("feature.BaseConv.weight", np.zeros(2, np.float32))], tmp_path / "t.bpk")
    base = {"source": {"path": "s.safetensors"}, "target": {"path": "o.bpk", "template": "t.bpk"}}
    with build_plan(recipe(**base), tmp_path) as plan:
        assert plan.report.missing == [("feature.BaseConv.weight", "")]
        assert plan.report.suggestion("feature.BaseConv.weight") == "feature.weight"
        assert "Did you mean: 'feature.weight'?" in plan.report.display()
    plan, _ = run(recipe(source={"path": "s.safetensors", "skip_enum_variants": True},
                           target={"path": "o.bpk", "template": "t.bpk"}), tmp_path)
    assert plan.report.applied == ["feature.BaseConv.weight"]


def test_burnpack_param_ids_and_scalars_carry_over(tmp_path: Path) -> None:
    save([from_numpy("w", arr(2), param_id=99)], tmp_path / "s.bpk", scalars={"epoch": Scalar("Int", 3)})
    _, out = run(recipe(source={"path": "s.bpk"}, target={"path": "o.bpk"}), tmp_path, file=RecipeFile("ab" * 32))
    with open_file(out) as o:
        assert o["w"].param_id == 99 and o.scalars == {"epoch": Scalar("Int", 3)}
        assert o.metadata["migrator.recipe_sha256"] == "ab" * 32
    _, out = run(recipe(source={"path": "s.bpk"}, target={"path": "o2.bpk", "scalars": {"step": {"uint": 7}}}),
                    tmp_path)
    assert open_file(out).scalars == {"step": Scalar("UInt", 7)}
    with build_plan(recipe(source={"path": "s.bpk"}, target={"path": "o.safetensors", "scalars": {"a": {"int": 1}}}),
                    tmp_path) as plan:
        assert any("cannot hold typed scalars" in f for f in plan.fatal)


def test_top_level_key_on_flat_formats(src: Path, tmp_path: Path) -> None:
    _, out = run(recipe(source={"path": str(src), "top_level_key": "model.enc"}, target={"path": "o.bpk"}),
                    tmp_path)
    assert sorted(open_file(out).names()) == ["0.bias", "0.weight", "2.weight"]
    with pytest.raises(PlanError, match="selects no tensor; top-level names: model"):
        build_plan(recipe(source={"path": str(src), "top_level_key": "nope"}, target={"path": "o3.bpk"}), tmp_path)


def test_same_inputs_give_identical_bytes_and_existing_target_survives(src: Path, tmp_path: Path) -> None:
    r = recipe(source={"path": str(src)}, target={"path": "a.bpk"})
    _, first = run(r, tmp_path, file=RecipeFile("00" * 32))
    data = Path(first).read_bytes()
    Path(first).rename(tmp_path / "first.bpk")
    _, second = run(r, tmp_path, file=RecipeFile("00" * 32))
    assert Path(second).read_bytes() == data
    with build_plan(r, tmp_path) as plan, pytest.raises(TargetExistsError):
        run_plan(plan, progress=False)
    assert Path(second).read_bytes() == data


def test_dtype_template_without_template_is_fatal(src: Path, tmp_path: Path) -> None:
    with build_plan(recipe(source={"path": str(src)}, dtype="template", target={"path": "o.bpk"}), tmp_path) as p:
        assert "dtype: template needs target.template" in p.fatal


def test_remap_syntax_is_honoured(tmp_path: Path) -> None:
    save([from_numpy("a.1.w", arr(2))], tmp_path / "s.safetensors")
    # `syntax: rust` keeps backslashes literal; auto would read \1 as a Python group reference
    r = recipe(source={"path": "s.safetensors"}, remap=[{"from": r"^a\.(\d)\.", "to": r"b\1.", "syntax": "rust"}],
               target={"path": "o.bpk"})
    with build_plan(r, tmp_path) as plan:
        assert [e.target for e in plan.entries] == ["b\\1.w"]
    r = recipe(source={"path": "s.safetensors"}, remap=[{"from": r"^a\.(\d)\.", "to": r"b\1."}],
               target={"path": "o.bpk"})
    with build_plan(r, tmp_path) as plan:
        assert [e.target for e in plan.entries] == ["b1.w"]

"""Benchmark checkpoints: GPT-2-shaped, generated tensor by tensor (never the whole model in RAM).

Every model is written once into `benchmarks/out/` (gitignored) as SafeTensors by migrator from
lazy random tensors; the other fixtures are derived from that file by migrator itself (PyTorch
zip `.pt`, a burnpack with the same names, and a Burn-layout burnpack made by `pytorch_to_burn`).

The weights are torch-Linear-shaped (`c_attn.weight` is `[3d, d]` = `[out, in]`), not GPT-2's
`Conv1D` layout (`[in, out]`): declaring `c_attn`/`c_fc`/`c_proj` as Linear in a recipe then
transposes the same number of bytes a real GPT-2 conversion would, which is what timing needs.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"

Shapes = list[tuple[str, tuple[int, ...]]]


def gpt2_shapes(layers: int, d: int, vocab: int = 50257, ctx: int = 1024) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Hugging Face GPT-2 names, 12 tensors per block plus 4: `12 * layers + 4` tensors."""
    yield "wte.weight", (vocab, d)
    yield "wpe.weight", (ctx, d)
    for i in range(layers):
        p = f"h.{i}."
        yield p + "ln_1.weight", (d,)
        yield p + "ln_1.bias", (d,)
        yield p + "attn.c_attn.weight", (3 * d, d)
        yield p + "attn.c_attn.bias", (3 * d,)
        yield p + "attn.c_proj.weight", (d, d)
        yield p + "attn.c_proj.bias", (d,)
        yield p + "ln_2.weight", (d,)
        yield p + "ln_2.bias", (d,)
        yield p + "mlp.c_fc.weight", (4 * d, d)
        yield p + "mlp.c_fc.bias", (4 * d,)
        yield p + "mlp.c_proj.weight", (d, 4 * d)
        yield p + "mlp.c_proj.bias", (d,)
    yield "ln_f.weight", (d,)
    yield "ln_f.bias", (d,)


# The `modules:` map of every transforming recipe: GPT-2's paths declared (see the module docstring).
MODULES = {"Linear": [r"\.(c_attn|c_fc|c_proj)$"], "Embedding": [r"^(wte|wpe)$"], "LayerNorm": [r"(^|\.)ln_(1|2|f)$"]}
LINEAR_WEIGHT = r"\.(c_attn|c_fc|c_proj)\.weight$"  # the same set, for the torch peer


@dataclass(frozen=True)
class Model:
    """One benchmark model: its name, shapes, and the fixtures derived from it in `OUT`."""

    name: str
    description: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def nbytes(self) -> int:
        return sum(4 * math.prod(s) for _, s in self.shapes)

    @property
    def count(self) -> int:
        return len(self.shapes)

    @property
    def largest(self) -> int:
        return max(4 * math.prod(s) for _, s in self.shapes)

    def path(self, kind: str) -> Path:
        """`safetensors`, `pt`, `bpk` (same names) or `burn.bpk` (Burn layout, F32)."""
        return OUT / f"{self.name}.{kind}"


def _model(name: str, description: str, **kw: int) -> Model:
    return Model(name, description, tuple(gpt2_shapes(**kw)))


MODELS: dict[str, Model] = {
    "gpt2-medium": _model("gpt2-medium", "GPT-2-medium shapes (24 layers, d=1024), fp32", layers=24, d=1024),
    "gpt2-xl": _model("gpt2-xl", "GPT-2-XL shapes (48 layers, d=1600), fp32", layers=48, d=1600),
    "10k": _model("10k", "10,000 small tensors (GPT-2 names, 833 layers, d=16), fp32",
                  layers=833, d=16, vocab=64, ctx=64),
    "100k": _model("100k", "100,000 small tensors (GPT-2 names, 8333 layers, d=16), fp32",
                   layers=8333, d=16, vocab=64, ctx=64),
}
FIXTURES = ("safetensors", "pt", "bpk", "burn.bpk")


def lazy_random(shapes: Shapes | tuple[tuple[str, tuple[int, ...]], ...], seed: int = 0) -> list:
    """Lazy fp32 tensors whose bytes are generated only when a writer asks for them."""
    import numpy as np

    from migrator.core import dtypes
    from migrator.core.tensor import LazyTensor

    out = []
    for i, (name, shape) in enumerate(shapes):
        def load(shape: tuple[int, ...] = shape, i: int = i) -> memoryview:
            arr = np.random.default_rng(seed + i).standard_normal(shape, dtype=np.float32)
            return memoryview(arr.reshape(-1).view(np.uint8))

        out.append(LazyTensor(name, dtypes.F32, tuple(shape), 4 * math.prod(shape), load))
    return out


def burn_recipe(model: Model, *, source: str, target: str, adapter: str, cast: str | None = None) -> Path:
    """Write a recipe next to the fixtures (paths relative to it) and return its path."""
    import yaml

    recipe: dict = {"version": 1, "source": {"path": source}, "modules": MODULES, "adapters": [adapter],
                    "target": {"path": target, "overwrite": True}}
    if cast:
        recipe["dtype"] = {"cast": cast}
    path = OUT / f"{model.name}.{adapter}{'-' + cast.lower() if cast else ''}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def missing_bytes(model: Model) -> int:
    """Bytes the fixtures still to generate will take."""
    return sum(model.nbytes for kind in FIXTURES if not model.path(kind).exists())


def ensure(model: Model, *, spare: int) -> bool:
    """Generate the model's missing fixtures; False (with a message) when the disk lacks room.

    `spare` is the room the jobs need on top (their outputs, deleted after each run).
    """
    OUT.mkdir(parents=True, exist_ok=True)
    need = missing_bytes(model) + spare
    free = shutil.disk_usage(OUT).free
    if need > free:
        print(f"skipping {model.name}: needs {need / 1e9:.1f} GB free, {free / 1e9:.1f} GB available",
              file=sys.stderr)
        return False
    from migrator import open_file, save

    st = model.path("safetensors")
    if not st.exists():
        print(f"generating {st} ({model.nbytes / 1e9:.2f} GB)", file=sys.stderr)
        save(lazy_random(model.shapes), st)
    for kind in ("pt", "bpk"):
        if not model.path(kind).exists():
            print(f"deriving {model.path(kind)}", file=sys.stderr)
            with open_file(st) as r:
                save(r.tensors, model.path(kind))
    burn = model.path("burn.bpk")
    if not burn.exists():
        print(f"deriving {burn} (pytorch_to_burn, F32)", file=sys.stderr)
        recipe = burn_recipe(model, source=st.name, target=burn.name, adapter="pytorch_to_burn")
        subprocess.run([sys.executable, "-m", "migrator.cli", "run", str(recipe), "--no-progress"], check=True,
                       stdout=subprocess.DEVNULL)
        recipe.unlink()
    return True

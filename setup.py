"""Builds the optional compiled kernels (migrator/core/kernels/*.c, one module: migrator.core._kernels);
everything else is in pyproject.toml.

`optional=True`: without a C compiler the install still succeeds and casts.py uses numpy.

-ffp-contract=off: no multiply and add fused by the compiler (GCC's default for GNU C fuses them on a
target with FMA, rounding once where the code rounds twice); the loops whose bits match numpy's or
torch's depend on it, and lora.c asks for its fused multiply-adds by name (fmaf).
"""

from glob import glob

from setuptools import Extension, setup

# sorted: the same link order, so the same shared object, on every file system
setup(ext_modules=[Extension("migrator.core._kernels", sorted(glob("migrator/core/kernels/*.c")), optional=True,
                             depends=["migrator/core/kernels/kernels.h"],
                             extra_compile_args=["-O3", "-ffp-contract=off"])])

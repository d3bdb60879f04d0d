"""Builds the optional compiled kernels (migrator/core/kernels/*.c, one module: migrator.core._kernels);
everything else is in pyproject.toml.

`optional=True`: without a C compiler the install still succeeds and casts.py uses numpy.
"""

from glob import glob

from setuptools import Extension, setup

# sorted: the same link order, so the same shared object, on every file system
setup(ext_modules=[Extension("migrator.core._kernels", sorted(glob("migrator/core/kernels/*.c")), optional=True,
                             depends=["migrator/core/kernels/kernels.h"], extra_compile_args=["-O3"])])

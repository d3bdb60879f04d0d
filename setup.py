"""Builds the optional compiled kernels (migrator/core/_kernels.c); everything else is in pyproject.toml.

`optional=True`: without a C compiler the install still succeeds and casts.py uses numpy.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("migrator.core._kernels", ["migrator/core/_kernels.c"], optional=True,
                             extra_compile_args=["-O3"])])

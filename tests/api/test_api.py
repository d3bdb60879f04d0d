"""The package namespace a Python user sees: every public name, lazily, and documented."""

from __future__ import annotations

import subprocess
import sys

import migrator


def test_public_names_resolve_and_are_documented() -> None:
    from migrator.core.scalars import Scalar
    from migrator.plan.report import ApplyReport

    assert migrator.Scalar is Scalar and migrator.ApplyReport is ApplyReport
    for name in migrator.__all__:
        assert getattr(migrator, name) is not None
        assert name in dir(migrator)
        if not name.startswith("_") and name != "PRODUCER":
            assert f"`{name}" in (migrator.__doc__ or ""), name


def test_import_migrator_imports_no_numpy() -> None:
    code = "import sys, migrator; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""A lone surrogate in a PyTorch name is refused at read time, as SafeTensors and burnpack refuse one.

torch.save pickles str keys with BINUNICODE and `surrogatepass`, and torch.load gives the name back;
no output format can store it, so migrator refuses the file with a FormatError naming it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from migrator.core.errors import FormatError
from migrator.files.io import open_file

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", ["enc\ud800.weight", "\udfff", "layer.0.w\udc80x"])
@pytest.mark.parametrize("zip_format", [True, False])
def test_a_lone_surrogate_in_a_name_is_a_format_error(tmp_path: Path, name: str, zip_format: bool) -> None:
    path = tmp_path / "m.pt"
    torch.save({"ok.weight": torch.ones(2), name: torch.zeros(3)}, path, _use_new_zipfile_serialization=zip_format)
    assert name in torch.load(path, weights_only=True)  # torch reads it back
    with pytest.raises(FormatError) as e:
        open_file(path)
    assert "lone surrogate" in str(e.value) and ascii(name) in str(e.value) and str(path) in str(e.value)


def test_nested_keys_with_a_lone_surrogate_are_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save({"model": {"blk\ud83d": {"w": torch.ones(1)}}}, path)
    with pytest.raises(FormatError, match="lone surrogate"):
        open_file(path, top_level_key="model")

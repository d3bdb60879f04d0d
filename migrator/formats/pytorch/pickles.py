"""The pickles of a torch.save container, each run by the restricted interpreter (`safepickle.vm`).

Zip, legacy and tar containers read their pickles here, with the reader's label and limits; the
main pickle's root is checked before anything is selected from it.
"""

from __future__ import annotations

from typing import Any

from ..safepickle import values as sp
from ..safepickle.vm import Unpickler
from .core import ReaderCore


class PickleContainer(ReaderCore):
    """What every container does with its pickles (the containers build on it, the flattening does not)."""

    def _unpickler(self, data: bytes | memoryview, *, start: int = 0, end: int | None = None,
                   persistent: Any = None, what: str = "pickle") -> Unpickler:
        return Unpickler(data, label=self.label, start=start, end=end, persistent_load=persistent,
                         limits=self._limits, what=what)

    def _run_main(self, u: Unpickler) -> Any:
        root = u.load()
        self._protocol = u.protocol  # None: protocol 0/1 pickles carry no PROTO opcode
        self._opaque |= u.opaque
        if isinstance(root, (sp.Placeholder, sp.Opaque)):  # whatever is selected is inside it: say so first
            raise self._placeholder_error("", root)
        return root

"""burnpack, Burn's format (`formats/burnpack.py`)."""

from __future__ import annotations

from ..spec import FormatSpec, Sniff

MAGIC = b"NRUB"  # burnpack.MAGIC ("BURN" big-endian) as the file's first bytes

SPEC = FormatSpec(
    name="burnpack", title="burnpack", summary="burnpack (Burn)", extensions=(".bpk", ".burnpack"),
    recognized_by="magic NRUB", sniffs=(Sniff(lambda head, size: head[:4] == MAGIC),),
    reader="migrator.formats.burnpack:BurnpackReader", writer="migrator.formats.burnpack:BurnpackWriter",
    metadata="text", metadata_format="burnpack", keeps_order=True, scalars=True, for_burn=True)

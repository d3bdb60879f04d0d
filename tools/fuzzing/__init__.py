"""The fuzzer behind tools/fuzz.py (its command line and the options it documents), one module per
reader family:

* `headers`: burnpack and SafeTensors (seeds, header fields, `--differential`: the header fast paths
  against their reference parsers);
* `pytorch`: zip, legacy and TAR checkpoints (seeds, zip/pickle fields, zip and TAR mutations,
  `--differential`: the pickle record scanner against the opcode loop);
* `gguf`: GGUF (seeds, header fields, `--differential`: migrator's reader against gguf-py's);
* `megatron`: legacy Megatron-LM checkpoint folders (seeds: one rank file of a TP=2 x PP=2 checkpoint
  the tests' writer makes; each case is the folder with that file mutated);
* `torch_dist`: megatron-core `torch_dist` folders (seeds: each file of a tiny checkpoint laid out as
  the tests lay it out; a case is the folder with one file, named by the input's first byte, replaced);
* `recipe`: recipes (seeds, YAML line edits, loading one);

and what they share: `common` (readers, exceptions, the per-case alarm), `mutations` (the op
interpreter and the random ops), `harness` (one case run and judged).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run from a checkout: migrator is the one beside tools/
    sys.path.insert(0, str(REPO))

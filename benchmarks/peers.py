"""What users run today, as one process per job (peak RSS of its own):

    python peers.py resave SRC.safetensors DST.safetensors
        safetensors `load_file` + `save_file`: the whole model read into memory, then written.
    python peers.py torch SRC.pt DST.safetensors [--half]
        `torch.load(mmap=True, weights_only=True)`, Linear weights transposed (`.t().contiguous()`),
        optionally `.half()`, then `safetensors.torch.save_file`: every changed tensor in memory.

Neither fsyncs its output.
"""

from __future__ import annotations

import argparse
import re

from models import LINEAR_WEIGHT


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=("resave", "torch"))
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--half", action="store_true")
    args = ap.parse_args()
    from safetensors.torch import load_file, save_file

    if args.kind == "resave":
        save_file(load_file(args.src), args.dst)
        return
    import torch

    linear = re.compile(LINEAR_WEIGHT)
    sd = torch.load(args.src, mmap=True, weights_only=True)
    out = {}
    for name, t in sd.items():
        if t.dim() == 2 and linear.search(name):
            t = t.t().contiguous()
        out[name] = t.half() if args.half and t.is_floating_point() else t
    save_file(out, args.dst)


if __name__ == "__main__":
    main()

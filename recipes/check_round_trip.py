"""Check that two files hold the same tensors, bit for bit (used by `make demo`).

    python recipes/check_round_trip.py A B [NAME_TO_IGNORE ...]
"""

from __future__ import annotations

import sys

from migrator import open_file


def main(a: str, b: str, *ignore: str) -> int:
    with open_file(a) as ra, open_file(b) as rb:
        left = {t.name: t for t in ra.tensors if t.name not in ignore}
        right = {t.name: t for t in rb.tensors if t.name not in ignore}
        if left.keys() != right.keys():
            print(f"different tensor names: {sorted(left.keys() ^ right.keys())}")
            return 1
        for name, t in left.items():
            u = right[name]
            if (t.dtype, t.shape) != (u.dtype, u.shape) or bytes(t.data()) != bytes(u.data()):
                print(f"tensor {name} differs")
                return 1
    skipped = f" (ignoring {', '.join(ignore)})" if ignore else ""
    print(f"round trip OK: {len(left)} tensors bit-identical in {a} and {b}{skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

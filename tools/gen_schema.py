"""Regenerate what is written from the recipe's models: schemas/recipe.schema.json (from
migrator/recipe/model.py) and docs/ops.md's reference of every op (from the registry, migrator/ops).
`--check`: only compare, exit 1 when one is stale.

The schema is checked in so editors (yaml-language-server) can validate recipes without
installing migrator; tests/recipe/test_recipe.py and tests/ops/test_registry.py fail when either
no longer matches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from migrator.ops.reference import replaced  # noqa: E402
from migrator.recipe.loader import recipe_json_schema_text  # noqa: E402

SCHEMA_PATH = REPO / "schemas" / "recipe.schema.json"
OPS_DOC_PATH = REPO / "docs" / "ops.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    stale = 0
    for path, fresh_of in ((SCHEMA_PATH, lambda _: recipe_json_schema_text()), (OPS_DOC_PATH, replaced)):
        current = path.read_text(encoding="utf-8") if path.exists() else None
        fresh = fresh_of(current or "")
        if current == fresh:
            continue
        if args.check:
            print(f"{path.relative_to(REPO)} is stale; run: python tools/gen_schema.py", file=sys.stderr)
            stale = 1
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fresh, encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    return stale


if __name__ == "__main__":
    sys.exit(main())

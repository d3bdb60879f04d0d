"""Regenerate schemas/recipe.schema.json from migrator/recipe/model.py (`--check`: exit 1 when stale).

The schema is checked in so editors (yaml-language-server) can validate recipes without
installing migrator; tests/recipe/test_recipe.py fails when it no longer matches the models.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from migrator.recipe.loader import recipe_json_schema_text  # noqa: E402

SCHEMA_PATH = REPO / "schemas" / "recipe.schema.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if the file is stale")
    args = parser.parse_args(argv)
    fresh = recipe_json_schema_text()
    current = SCHEMA_PATH.read_text(encoding="utf-8") if SCHEMA_PATH.exists() else None
    if args.check:
        if current != fresh:
            print(f"{SCHEMA_PATH.relative_to(REPO)} is stale; run: python tools/gen_schema.py", file=sys.stderr)
            return 1
        return 0
    if current != fresh:
        SCHEMA_PATH.parent.mkdir(parents=True, exist_ok=True)
        SCHEMA_PATH.write_text(fresh, encoding="utf-8")
        print(f"wrote {SCHEMA_PATH.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

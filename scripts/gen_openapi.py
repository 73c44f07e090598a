#!/usr/bin/env python
"""Write the API's OpenAPI document to openapi/openapi.json; `--check` fails when it is stale.

The document is generated from the application itself (no server, no database), with sorted
keys so the committed file only changes when the API does.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT = REPO_ROOT / "openapi" / "openapi.json"


def render() -> str:
    sys.path.insert(0, str(REPO_ROOT))
    from jobcore.settings import Settings
    from server.app import create_app

    with tempfile.TemporaryDirectory() as scratch:
        # A throwaway data dir: building the app must not touch the operator's real one.
        app = create_app(Settings(data_dir=Path(scratch), bootstrap_token=None), dispatch=lambda _: None)
        document = app.openapi()
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if openapi/openapi.json is not current")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    current = render()
    if args.check:
        existing = args.output.read_text() if args.output.exists() else ""
        if existing != current:
            print(f"{args.output} is stale: run `python scripts/gen_openapi.py`", file=sys.stderr)
            return 1
        print(f"{args.output} is current")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(current)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The service imports and builds its apps with only its declared runtime dependencies: a package
that only the dev extras bring (greenlet came with them once) must not be what makes it start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "runtime_only.py"


def test_the_service_needs_nothing_outside_its_runtime_dependencies(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # The control: a dev-only package is refused, so a clean import below means something.
    assert report["control"] == "refused", report["control"]
    assert "sqlalchemy" in report["runtime"] and "pytest" not in report["runtime"]
    assert report["failures"] == {}, json.dumps(report["failures"], indent=2)

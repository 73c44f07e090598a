"""The HTTP client is its own torch-free distribution: client/ builds `twinkle-jobs-client`, whose
only dependency is httpx, and whose package imports in an interpreter that cannot import torch
or any of the service's packages.

The wheel is built from a copy of client/ (pip builds in the source tree, and the tree must stay
clean), offline: no build isolation, no index.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What the client must never pull in: the service's packages and its heavy dependencies.
FORBIDDEN_DISTRIBUTIONS = {"torch", "transformers", "accelerate", "fastapi", "sqlalchemy", "celery"}
FORBIDDEN_MODULES = ("torch", "transformers", "accelerate", "server", "worker", "twinkle_core")


def pip(*args: str) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("client-wheel")
    source = work / "client"
    shutil.copytree(
        ROOT / "client", source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    )
    dist = work / "dist"
    pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(dist), str(source))
    wheels = list(dist.glob("twinkle_jobs_client-0.1.0-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_depends_on_httpx_only(client_wheel: Path) -> None:
    with zipfile.ZipFile(client_wheel) as wheel:
        names = wheel.namelist()
        metadata = Parser().parsestr(wheel.read("twinkle_jobs_client-0.1.0.dist-info/METADATA").decode())
    assert metadata["Name"] == "twinkle-jobs-client"
    assert metadata["Requires-Python"] == ">=3.11"
    requires = metadata.get_all("Requires-Dist") or []
    distributions = {re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0].lower() for r in requires}
    assert distributions == {"httpx"}, requires
    assert not distributions & FORBIDDEN_DISTRIBUTIONS
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"twinkle_client"}, names


def test_installed_wheel_imports_without_torch_or_the_service(client_wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    pip("install", "--no-deps", "--no-index", "-q", "--target", str(target), str(client_wheel))
    # `-I`: no PYTHONPATH, no user site, no current directory on sys.path. The venv's site-packages
    # (httpx) stays, after the wheel's target; a finder first on sys.meta_path refuses the rest.
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(target)!r})
        FORBIDDEN = {FORBIDDEN_MODULES!r}

        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in FORBIDDEN:
                    raise ImportError(f"{{name}} must not be imported by twinkle_client")
                return None

        sys.meta_path.insert(0, Refuse())
        import twinkle_client
        from twinkle_client import APIError, TwinkleClient

        assert twinkle_client.__file__.startswith({str(target)!r}), twinkle_client.__file__
        client = TwinkleClient("http://127.0.0.1:1", token="x")
        client.close()
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
        assert not loaded, loaded
        print("ok", APIError.__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "ok APIError"

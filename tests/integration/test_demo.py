"""README's first command in miniature, from a plain (non-editable) install: `twinkle-jobs migrate`
and `twinkle-jobs demo` run from the service's wheel, outside the source tree. The demo starts its
own server and worker on the embedded defaults, fine-tunes the tiny model through the HTTP API and
prints the checkpoint."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the service's wheel is built from (pyproject.toml's package list, plus its readme).
SOURCES = ["pyproject.toml", "README.md", "twinkle", "twinkle_core", "jobcore", "server", "worker",
           "twinkle_cli", "client", "migrations"]  # fmt: skip
PACKAGES = ["twinkle", "twinkle_core", "jobcore", "server", "worker", "twinkle_cli", "twinkle_client",
            "migrations"]  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The service's wheel, built from a copy of the sources and unpacked as site-packages would
    hold it. Nothing of the source tree is importable from there: no alembic.ini, no repo root."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "node_modules")
    for name in SOURCES:
        origin = REPO_ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=ignore)
        else:
            shutil.copy2(origin, source / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(tmp), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp.glob("twinkle_jobs-*.whl")
    site = tmp / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def _env(site: Path, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINKLE_")}
    # PYTHONPATH comes before site-packages, so the wheel's copy wins over the editable install;
    # the worker's torchrun children inherit it.
    env.update({"TWINKLE_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(site)})
    return env


def test_the_wheel_carries_every_package_and_the_migrations(installed: Path, tmp_path: Path) -> None:
    for package in PACKAGES:
        assert (installed / package / "__init__.py").is_file(), package
    assert (installed / "migrations" / "script.py.mako").is_file()
    assert sorted(p.name for p in (installed / "migrations" / "versions").glob("0*.py"))
    code = "import jobcore, migrations, server, twinkle_cli, worker; print(*(m.__file__ for m in " \
        "(jobcore, migrations, server, twinkle_cli, worker)))"  # fmt: skip
    env = _env(installed, tmp_path)
    where = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert where.returncode == 0, where.stderr
    assert all(Path(path).is_relative_to(installed) for path in where.stdout.split()), where.stdout


def test_installed_service_migrates_and_runs_the_demo(installed: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = _env(installed, data_dir)
    migrate = subprocess.run(
        [sys.executable, "-m", "twinkle_cli.main", "migrate"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    (database,) = data_dir.glob("*.db")
    tables = {row[0] for row in sqlite3.connect(database).execute("SELECT name FROM sqlite_master")}
    assert {"jobs", "projects", "alembic_version"} <= tables

    result = subprocess.run(
        [sys.executable, "-m", "twinkle_cli.main", "demo", "--steps", "2", "--nproc", "1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"job job-\w+ succeeded", result.stdout)
    match = re.search(r"final checkpoint: (\S+)", result.stdout)
    assert match, result.stdout
    checkpoint = Path(match.group(1))
    assert checkpoint.is_relative_to(data_dir)
    assert (checkpoint / "COMPLETE").exists() and (checkpoint / "model.safetensors").exists()
    # ... and the name to call it by once `twinkle-jobs up` serves it.
    job_id = re.search(r"job (job-\w+) succeeded", result.stdout)
    assert job_id and f"model name: ft:tiny-llama:demo:{job_id.group(1)}" in result.stdout
    assert "next: `twinkle-jobs up` (same data dir) serves the dashboard and this model" in result.stdout
    # The demo stops what it started: no server, worker or trainer of this data dir is left running.
    assert _processes_with_data_dir(str(data_dir)) == []


def _processes_with_data_dir(data_dir: str) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TWINKLE_DATA_DIR") == data_dir and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found

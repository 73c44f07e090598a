"""Import the whole service with only its runtime dependencies importable.

    python tests/support/runtime_only.py

The test environment holds the `dev` extras too (pytest, openai, playwright, moto, ...), and
their own dependencies can hide a runtime dependency the project forgot to declare: greenlet
came with them, so the test suite passed while a plain `./scripts/setup.sh` gave a server that
died at start. Here a finder refuses every top-level module whose distributions are all outside
the closure of the runtime dependencies (`[project.dependencies]` of pyproject.toml, followed
through the installed packages' metadata with the extras each one asks for), then every module
of the service is imported and the apps are built as `twinkle-jobs up` builds them.

Prints one JSON object: the modules that failed to import and why, and whether a module known
to be outside the runtime closure (pytest) was refused, so that the caller can tell a finder
that refuses nothing from a clean import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import json
import pkgutil
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if TYPE_CHECKING:  # at run time only after the finder is in place, so its imports are checked too
    from jobcore.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def shipped_packages(pyproject: Path) -> list[str]:
    """The top-level packages the distribution ships (pyproject's setuptools `include`)."""
    include = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    names = (pattern.removesuffix(".*").removesuffix("*") for pattern in include)
    return list(dict.fromkeys(name for name in names if "." not in name))


PACKAGES = shipped_packages(REPO_ROOT / "pyproject.toml")
# Modules that are not meant to import on a runtime-only install, and why.
OPTIONAL = {
    "worker.ray_gang": "imports ray: the `ray` extra, loaded only when a job asks for Ray",
    "migrations.env": "Alembic's environment script: it runs inside Alembic's context only",
}


def runtime_closure(pyproject: Path) -> set[str]:
    """Canonical names of the distributions a runtime-only install of the project brings."""
    declared = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    todo = [Requirement(raw) for raw in declared]
    found: set[str] = set()
    visited: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in visited:
            continue
        visited.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # not for this platform (a marker pip evaluated), so nothing imports it here
        found.add(key[0])
        for raw in dist.requires or []:
            dep = Requirement(raw)
            extras = {"", *req.extras}
            if dep.marker is None or any(dep.marker.evaluate({"extra": extra}) for extra in extras):
                todo.append(dep)
    return found


class RefuseOutside(importlib.abc.MetaPathFinder):
    def __init__(self, refused: set[str]) -> None:
        self.refused = refused

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.refused:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (not a runtime dependency)", name=fullname
            )
        return None


def settings_for(data_dir: Path) -> Settings:
    from jobcore.settings import Settings

    return Settings(data_dir=data_dir, database_url="postgresql+psycopg://twinkle@127.0.0.1:1/x")


def build_api(data_dir: Path) -> None:
    from server.app import create_app

    create_app(settings_for(data_dir))


def build_celery(data_dir: Path) -> None:
    from worker.celery_app import make_celery

    make_celery(settings_for(data_dir))


def build_serving_host(data_dir: Path) -> None:
    from serving.host import build_app, build_engine

    settings = settings_for(data_dir)
    build_app(settings, build_engine(settings), None)


def main() -> None:
    runtime = runtime_closure(REPO_ROOT / "pyproject.toml")
    refused = {
        module
        for module, dists in metadata.packages_distributions().items()
        if module not in PACKAGES and all(canonicalize_name(dist) not in runtime for dist in dists)
    }
    sys.meta_path.insert(0, RefuseOutside(refused))

    failures: dict[str, str] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name in OPTIONAL:
                continue
            try:
                importlib.import_module(info.name)
            except Exception as exc:
                failures[info.name] = f"{type(exc).__name__}: {exc}"

    # Build what `twinkle-jobs up` builds (nothing connects: engines connect on first use). The
    # PostgreSQL URL gives the API its async read engine, which needs greenlet.
    with tempfile.TemporaryDirectory() as data_dir:
        for name, build in (
            ("the API app", build_api),
            ("the Celery app", build_celery),
            ("the serving host app", build_serving_host),
        ):
            try:
                build(Path(data_dir))
            except Exception as exc:
                failures[name] = f"{type(exc).__name__}: {exc}"

    try:
        importlib.import_module("pytest")
        control = "pytest imported: the finder refused nothing"
    except ModuleNotFoundError:
        control = "refused"
    print(json.dumps({"failures": failures, "control": control, "runtime": sorted(runtime)}))


if __name__ == "__main__":
    main()

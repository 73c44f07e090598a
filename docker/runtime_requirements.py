#!/usr/bin/env python3
"""Print the project's runtime dependencies from pyproject.toml as a pip requirements file.

The images install dependencies in a layer of their own (before the source is copied, so a code
change does not reinstall torch) and must never let pip swap the image's torch build: the worker
image's CUDA torch comes from its base image, the server image's CPU torch from the CPU index.
`--keep-installed NAME` replaces NAME's pyproject line with `NAME==<installed version>`, which pip
finds already satisfied; a dependency that wanted another torch then fails the build instead of
silently pulling a different (multi-GB, wrong-CUDA) wheel.

`--extra NAME` adds the packages of `[project.optional-dependencies].NAME` (the images install
`trackers`, so `training.report_to` works on the server that validates it and the workers that
write it); an extra pyproject does not define is an error, not silently nothing.

Usage: runtime_requirements.py PYPROJECT [--keep-installed NAME ...] [--extra NAME ...] > requirements.txt
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

# PEP 508: the distribution name is the leading run of letters, digits, '.', '_' and '-'.
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical_name(name: str) -> str:
    """PEP 503 normalisation, so `Torch`, `torch` and `torch_` compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"pyproject.toml: cannot read a package name from dependency {requirement!r}")
    return canonical_name(match.group(1))


def runtime_requirements(
    pyproject: Path, keep_installed: list[str], extras: list[str] | None = None
) -> list[str]:
    """The `[project].dependencies` of `pyproject` and of the named `extras`, with each
    `keep_installed` package pinned as installed."""
    with pyproject.open("rb") as handle:
        project = tomllib.load(handle).get("project", {})
    dependencies = project.get("dependencies")
    if not isinstance(dependencies, list) or not dependencies:
        raise ValueError(f"{pyproject}: [project].dependencies is missing or empty")
    optional = project.get("optional-dependencies", {})
    for extra in extras or []:
        if extra not in optional:
            raise ValueError(f"--extra {extra}: pyproject defines no such extra (it has {sorted(optional)})")
        dependencies = [*dependencies, *optional[extra]]
    keep = {canonical_name(name) for name in keep_installed}
    declared = {requirement_name(dep) for dep in dependencies}
    undeclared = sorted(keep - declared)
    if undeclared:
        raise ValueError(f"--keep-installed names packages that pyproject does not depend on: {undeclared}")
    lines: list[str] = []
    for dependency in dependencies:
        name = requirement_name(dependency)
        if name not in keep:
            lines.append(dependency)
            continue
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise ValueError(
                f"--keep-installed {name}: it is not installed in this image; install it before this step"
            ) from None
        lines.append(f"{name}=={installed}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pyproject", type=Path)
    parser.add_argument("--keep-installed", action="append", default=[], metavar="NAME")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    try:
        lines = runtime_requirements(args.pyproject, args.keep_installed, args.extra)
    except (OSError, ValueError) as exc:
        print(f"runtime_requirements: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""No import cycles between our modules, counting every import the code can execute.

A cycle held apart only by a function-level import (or an `if TYPE_CHECKING:` one) is still a
cycle: the two modules cannot be understood or tested one without the other, and moving the
import to the top of the file breaks at import time. So the graph counts module-level,
function-level and TYPE_CHECKING imports alike, parsed with `ast` (nothing is imported).

Edges: `import a.b.c` and `from a.b.c import name` go to `a.b.c` (its `__init__` when it is a
package); `from a.b import c` where `c` is a submodule goes to `a.b.c`. A parent package's
`__init__` that Python runs on the way is not an edge: counting it would make every package that
re-exports its submodules trivially cyclic with them, and the code does not name it.

Parametrised over lists of roots (top-level packages) so that other packages can be added.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# Where each top-level package lives (the client is its own distribution in client/).
PACKAGE_DIRS = {"twinkle_client": ROOT / "client" / "twinkle_client"}
SERVICE = [
    "twinkle",
    "twinkle_core",
    "jobcore",
    "server",
    "worker",
    "serving",
    "twinkle_cli",
    "twinkle_client",
    "migrations",
]
# Who may import whom (docs/architecture.md): a top-level package may import only those listed.
ALLOWED_IMPORTS = {
    "twinkle_core": set(),
    "twinkle": {"twinkle_core"},
    "twinkle_client": set(),
    "jobcore": {"twinkle_core", "migrations"},
    "migrations": {"jobcore"},
    "server": {"jobcore", "twinkle_core"},
    "worker": {"jobcore", "twinkle_core"},
    "serving": {"jobcore", "twinkle_core"},
    "twinkle_cli": {"jobcore", "server", "worker", "serving", "twinkle_client", "twinkle_core"},
}


def collect_modules(roots: list[str]) -> dict[str, Path]:
    """Every module below the root packages, by dotted name."""
    modules: dict[str, Path] = {}
    for root in roots:
        directory = PACKAGE_DIRS.get(root, ROOT / root)
        for path in sorted(directory.rglob("*.py")):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([root, *parts])] = path
    return modules


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def resolve_relative(module: str, path: Path, level: int, target: str | None) -> str:
    """The absolute name of `from <level dots><target> import ...` inside `module`."""
    package = module.split(".") if is_package(path) else module.split(".")[:-1]
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, target] if target else base)


def imported_modules(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `module` imports anywhere in its file."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = resolve_relative(module, path, node.level, node.module)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    found.add(submodule)
                elif source in modules:  # a name defined in (or re-exported by) `source`
                    found.add(source)
    found.discard(module)
    return found


def import_graph(roots: list[str]) -> dict[str, set[str]]:
    modules = collect_modules(roots)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None: a depth-first search."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = grey
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if colour.get(target, black) == grey:
                return [*stack[stack.index(target) :], target]
            if colour.get(target) == white:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        stack.pop()
        colour[node] = black
        return None

    for node in sorted(graph):
        if colour[node] == white:
            cycle = visit(node)
            if cycle is not None:
                return cycle
    return None


@pytest.mark.parametrize("roots", [["twinkle_core"], SERVICE], ids=lambda roots: "+".join(roots))
def test_no_import_cycles(roots: list[str]) -> None:
    graph = import_graph(roots)
    assert len(graph) > 1, f"no modules found under {roots}"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def wall_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one top-level package into another that ALLOWED_IMPORTS does not list."""
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if (a := source.split(".")[0]) != (b := target.split(".")[0]) and b not in ALLOWED_IMPORTS[a]
    )


def test_each_package_imports_only_what_the_architecture_allows() -> None:
    # server and worker never import each other; the library imports nothing of the service.
    crossings = wall_crossings(import_graph(SERVICE))
    assert not crossings, "imports across the walls: " + ", ".join(crossings)
    # ... and the check sees one: a worker module importing the server (or the reverse).
    assert wall_crossings({"worker.x": {"server.app"}, "server.y": {"worker.z", "jobcore.db"}}) == [
        "server.y -> worker.z",
        "worker.x -> server.app",
    ]


def test_the_graph_sees_function_level_and_submodule_imports(tmp_path: Path) -> None:
    # The rules above on a package of our own: a cycle closed only by a function-level import
    # through `from pkg import sub` is found.
    graph = {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.a"},
    }
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    modules = {
        "twinkle_core.remote": ROOT / "twinkle_core/remote/__init__.py",
        "twinkle_core.remote.decorator": ROOT / "twinkle_core/remote/decorator.py",
    }
    source = tmp_path / "mod.py"
    source.write_text(
        "def f():\n"
        "    from twinkle_core.remote import decorator\n"
        "    from twinkle_core.remote import remote_class\n"
    )
    found = imported_modules("other.mod", source, modules)
    assert found == {"twinkle_core.remote", "twinkle_core.remote.decorator"}

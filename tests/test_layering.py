"""The floors of the house, read from the source with ``ast``: no import circle anywhere in
``src/fitbox``, and no import from a lower floor to a higher one (DESIGN.md's rooms). Every
import counts: at module level, inside a function, and under ``if TYPE_CHECKING:``."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "fitbox"

# Top to bottom. A module imports its own floor or a lower one, never a higher one.
FLOORS: dict[str, int] = {
    "fitbox.__main__": 5,
    "fitbox.cli": 5,  # every command, central's and installer's too (cli/__init__: COMMANDS)
    "fitbox.installer": 5,
    "fitbox.central": 4,  # above the box's server: the box never imports the central
    "fitbox.server": 3,
    "fitbox.box": 2,
    "fitbox.models": 1,
    "fitbox.harness": 1,  # the tools pointed at a box (pure; the helper model's blocks too)
    "fitbox.probe": 1,
    "fitbox.engines": 1,
    "fitbox.store": 1,
    "fitbox.core": 0,
}
# Shared leaves: any floor may import them; they import nothing from box/ or above.
LEAVES = frozenset(
    {
        "fitbox",
        "fitbox.config",
        "fitbox.errors",
        "fitbox.home",
        "fitbox.networks",
        "fitbox.units",
        "fitbox.setting_values",
        "fitbox.setting_api",
        "fitbox.setting_table",
        "fitbox.setting_connections",
        "fitbox.setting_tasks",
        "fitbox.setting_central",
        "fitbox.listening",
        "fitbox.quiet_server",
    }
)
LEAF_CEILING = FLOORS["fitbox.box"]


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.importer} imports {self.imported}"


def modules(src: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` under ``src`` by dotted name (a package is its __init__)."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _targets(
    node: ast.Import | ast.ImportFrom, name: str, path: Path, known: set[str]
) -> list[str]:
    """The dotted names one import statement reaches (a module, or a name in one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def edges(src: Path, package: str = PACKAGE) -> tuple[list[Edge], list[Edge]]:
    """(import edges between the package's modules, imports of its modules that do not exist)."""
    known = modules(src, package)
    found: list[Edge] = []
    missing: list[Edge] = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(node, name, path, set(known)):
                if target != package and not target.startswith(f"{package}."):
                    continue  # stdlib or a third party
                edge = Edge(name, target, f"{src.name}/{path.relative_to(src)}", node.lineno)
                if target not in known:
                    missing.append(edge)
                elif target != name and edge not in found:
                    found.append(edge)
    return found, missing


def floor(module: str) -> int | None:
    for prefix, level in FLOORS.items():
        if module == prefix or module.startswith(f"{prefix}."):
            return level
    return None


def circles(found: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, list[str]] = {}
    for edge in found:
        graph.setdefault(edge.importer, []).append(edge.imported)
        graph.setdefault(edge.imported, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def violations(src: Path = SRC, package: str = PACKAGE) -> list[str]:
    """One line per offending edge, naming its file and line."""
    found, missing = edges(src, package)
    problems = [f"{e}: no such module" for e in missing]
    for name in modules(src, package):
        if name not in LEAVES and floor(name) is None:
            problems.append(f"{name}: on no floor; add it to FLOORS in {Path(__file__).name}")
    for edge in found:
        high, low = floor(edge.imported), floor(edge.importer)
        if edge.importer in LEAVES:
            if edge.imported not in LEAVES and high is not None and high >= LEAF_CEILING:
                problems.append(f"{edge}: a shared leaf imports floor {high}")
        elif edge.imported not in LEAVES and high is not None and low is not None and high > low:
            problems.append(f"{edge}: floor {low} imports floor {high}")
    for members in circles(found):
        inside = set(members)
        problems.append("import circle: " + ", ".join(members))
        problems += [f"  {e}" for e in found if e.importer in inside and e.imported in inside]
    return problems


def test_no_import_circle_and_no_import_from_a_lower_floor_to_a_higher_one() -> None:
    found = violations()
    assert not found, "\n".join(["", *found])


def test_every_import_of_the_package_names_a_module_that_exists() -> None:
    found, missing = edges(SRC)
    assert not missing, "\n".join(str(e) for e in missing)
    assert len(found) > 100  # the reader saw the real tree, not an empty one
    rooms = {e.importer.split(".")[1] for e in found if "." in e.importer}
    assert {"server", "box", "models", "probe", "engines", "store", "core"} <= rooms


def test_the_checker_names_each_circle_and_each_upward_edge_by_file(tmp_path: Path) -> None:
    files = {
        "src/fitbox/__init__.py": "",
        "src/fitbox/config.py": "def f():\n    from fitbox.server import trust\n",
        "src/fitbox/units.py": "",
        "src/fitbox/core/__init__.py": "",
        "src/fitbox/core/a.py": "from fitbox.units import x\nfrom . import b\n",
        "src/fitbox/core/b.py": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .a import A\n",
        "src/fitbox/store/__init__.py": "",
        "src/fitbox/store/db.py": "from ..core import a\nimport fitbox.box.box\n",
        "src/fitbox/box/__init__.py": "",
        "src/fitbox/box/box.py": "from fitbox.store.db import Store\nfrom .gone import X\n",
        "src/fitbox/server/__init__.py": "",
        "src/fitbox/server/trust.py": "import fitbox.config\n",
        "src/fitbox/attic.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert violations(tmp_path / "src") == [
        "src/fitbox/box/box.py:2: fitbox.box.box imports fitbox.box.gone: no such module",
        "fitbox.attic: on no floor; add it to FLOORS in test_layering.py",
        "src/fitbox/config.py:2: fitbox.config imports fitbox.server.trust: a shared leaf "
        "imports floor 3",
        "src/fitbox/store/db.py:2: fitbox.store.db imports fitbox.box.box: floor 1 imports floor 2",
        "import circle: fitbox.box.box, fitbox.store.db",
        "  src/fitbox/box/box.py:1: fitbox.box.box imports fitbox.store.db",
        "  src/fitbox/store/db.py:2: fitbox.store.db imports fitbox.box.box",
        "import circle: fitbox.config, fitbox.server.trust",
        "  src/fitbox/config.py:2: fitbox.config imports fitbox.server.trust",
        "  src/fitbox/server/trust.py:1: fitbox.server.trust imports fitbox.config",
        "import circle: fitbox.core.a, fitbox.core.b",
        "  src/fitbox/core/a.py:2: fitbox.core.a imports fitbox.core.b",
        "  src/fitbox/core/b.py:3: fitbox.core.b imports fitbox.core.a",
    ]

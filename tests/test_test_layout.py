"""The tests' own layout: a test module imports what it shares from tests/support/, never
another test module or conftest.py (whose only job is fixtures); support/ imports no test."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .support.processes import running_fitbox
from .support.speed import PROCESS_HELPERS, names_reached, starts_processes

TESTS = Path(__file__).resolve().parent


def imported_modules(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, relative ones written out
    (``from .conftest import X`` in tests/ is ``tests.conftest``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            # `from tests import test_x` names a module too
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(TESTS.parent).parent.parts)


def is_test_or_conftest(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and (parts[-1] == "conftest" or parts[-1].startswith("test_"))


def test_no_test_module_imports_another_test_module_or_conftest() -> None:
    sources = [*TESTS.glob("*.py"), *(TESTS / "support").glob("*.py")]
    problems = [
        f"{path.relative_to(TESTS.parent)} imports {module}: move what it needs to tests/support/"
        for path in sources
        for module in sorted(imported_modules(path.read_text(), package_of(path)))
        if is_test_or_conftest(module)
    ]
    assert not problems, "\n".join(problems)


def test_the_check_sees_relative_absolute_and_nested_imports_of_tests() -> None:
    """The walk above would pass vacuously if it misread imports: it must see every form."""
    source = (
        "from .conftest import BOX\n"
        "from tests.test_app import call_rows\n"
        "from tests import test_engines\n"
        "from .support.ggufs import write_tiny_llama\n"
        "def f():\n    from ..test_movers import box_on\n"
    )
    seen = {m for m in imported_modules(source, "tests.support") if is_test_or_conftest(m)}
    assert seen == {
        "tests.support.conftest",
        "tests.test_app",
        "tests.test_engines",
        "tests.test_movers",
    }
    assert not {m for m in imported_modules(source, "tests") if m.endswith("ggufs")} - {
        "tests.support.ggufs"
    }


def _splits_a_model() -> None:
    """Stands for a helper of a test file that starts a process (never called)."""
    running_fitbox(Path("home"), [])


def _a_test_body() -> None:
    _splits_a_model()


def test_a_process_started_through_a_helper_of_the_file_makes_a_test_slow() -> None:
    # looked up by name: naming the sample here would make this very test slow
    sample = globals()["_a_test_body"]
    assert "running_fitbox" in names_reached(sample)
    assert PROCESS_HELPERS & names_reached(sample)


def test_a_test_that_starts_nothing_is_left_in_the_fast_run(request: pytest.FixtureRequest) -> None:
    assert not starts_processes(request.node)
    assert request.node.get_closest_marker("slow") is None

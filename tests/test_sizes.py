"""The sizes of the house, read from the source with ``ast``: no module in ``src/fitbox`` over
500 lines and no function (or method) over 60, so each reads on a screen or two. A function's
lines run from its ``def`` to its last line, nested functions included; a module's are its
physical lines."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "fitbox"
MODULE_LINES = 500
FUNCTION_LINES = 60


def offenders(
    src: Path = SRC,
    package: str = PACKAGE,
    module_lines: int = MODULE_LINES,
    function_lines: int = FUNCTION_LINES,
) -> list[str]:
    """One line per module or function over its limit, naming its file (and line)."""
    found = []
    for path in sorted((src / package).rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(src.parent) if src.parent in path.parents else path
        length = len(text.splitlines())
        if length > module_lines:
            found.append(f"{where}: {length} lines (at most {module_lines})")
        functions = [
            node
            for node in ast.walk(ast.parse(text, filename=str(path)))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        for node in sorted(functions, key=lambda f: f.lineno):
            span = (node.end_lineno or node.lineno) - node.lineno + 1
            if span > function_lines:
                found.append(
                    f"{where}:{node.lineno}: {node.name} is {span} lines (at most {function_lines})"
                )
    return found


def test_no_module_over_500_lines_and_no_function_over_60() -> None:
    found = offenders()
    assert not found, "\n".join(["", *found])


def test_the_reader_saw_the_real_tree() -> None:
    """A checker that read nothing would pass: at a limit of one line, every module offends."""
    found = offenders(module_lines=1, function_lines=1)
    assert len([f for f in found if f.endswith(" lines (at most 1)")]) > 100
    assert any(f.startswith("src/fitbox/core/") for f in found)


def test_the_checker_names_each_long_module_and_function_by_file(tmp_path: Path) -> None:
    package = tmp_path / "src" / "fitbox"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "short.py").write_text("def fits():\n" + "    x = 1\n" * 4)
    (package / "long.py").write_text(
        "class Holder:\n"
        "    async def method(self):\n" + "        x = 1\n" * 5 + "\n"
        "def outer():\n"
        "    def inner():\n" + "        x = 1\n" * 5
    )
    found = offenders(tmp_path / "src", module_lines=10, function_lines=5)
    assert found == [
        "src/fitbox/long.py: 15 lines (at most 10)",
        "src/fitbox/long.py:2: method is 6 lines (at most 5)",
        "src/fitbox/long.py:9: outer is 7 lines (at most 5)",
        "src/fitbox/long.py:10: inner is 6 lines (at most 5)",
    ]

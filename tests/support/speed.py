"""Which tests are slow: those that start a real process, so that `pytest -m "not slow"`
runs the rest in seconds (tests/conftest.py marks them at collection)."""

from __future__ import annotations

import types

import pytest

# A test is slow when it starts a real process (llama-server, fitbox, PostgreSQL, chromium,
# prometheus, a network namespace, a venv build): `pytest -m "not slow"` runs the rest in
# seconds. Told by the file (*_e2e.py and the namespace tests start processes throughout;
# the surface fuzz starts none but runs hypothesis over every route for over a minute),
# the `engine` marker, a fixture below that starts or builds one, or a process helper of
# tests/support/ named in the test's body or a function of its file that it calls.
SLOW_FILES = ("_e2e.py", "_netns.py", "test_fuzz_surface.py")
PROCESS_FIXTURES = frozenset(
    {"llama_server_bin", "postgres", "quant_cache", "tf_python", "smol_tf", "minilm_tf"}
)
PROCESS_HELPERS = frozenset(
    {"running_fitbox", "start_fitbox", "PostgresCluster", "chromium", "split_gguf", "quantize"}
)


def _names_in(code: types.CodeType) -> set[str]:
    """Every global or attribute name a function's code uses, nested functions included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_in(const)
    return names


def names_reached(function: types.FunctionType) -> set[str]:
    """The names ``function`` uses, and those of its own module's functions it calls (a
    test that splits a GGUF through a helper of its file starts the splitter too)."""
    reached: set[str] = set()
    todo, seen = [function], set()
    while todo:
        current = todo.pop()
        seen.add(current)
        names = _names_in(current.__code__)
        reached |= names
        for name in names:
            found = current.__globals__.get(name)
            if (
                isinstance(found, types.FunctionType)
                and found.__module__ == function.__module__
                and found not in seen
            ):
                todo.append(found)
    return reached


def starts_processes(item: pytest.Item) -> bool:
    if item.path.name.endswith(SLOW_FILES) or item.get_closest_marker("engine"):
        return True
    if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    # a fixture parametrized by a process fixture's name fetches it by that name
    # (tests/test_central.py's ``target``: request.getfixturevalue("postgres"))
    params = getattr(getattr(item, "callspec", None), "params", {})
    if PROCESS_FIXTURES & {str(value) for value in params.values()}:
        return True
    function = getattr(item, "function", None)
    return isinstance(function, types.FunctionType) and bool(
        PROCESS_HELPERS & names_reached(function)
    )

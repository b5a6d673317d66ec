"""The user guide: the site builds with ``mkdocs build --strict`` (no broken link or anchor,
no page left out of the navigation), its reference pages are what the code's tables write
(tests/support/docs_gen.py), and README stays one screen that points into it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .support.docs_gen import pages, raised_codes
from .support.paths import REPO

README = REPO / "README.md"
CI_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[llama,test]' && .venv/bin/ruff check "
    ". && .venv/bin/ruff format --check . && .venv/bin/mypy && .venv/bin/python -m pytest"
)


def test_the_site_builds_strict_without_a_warning(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output
    assert not re.search(r"^(WARNING|ERROR)\b", output, re.M), output
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").is_file()


def test_every_generated_page_is_current() -> None:
    stale = [str(p.relative_to(REPO)) for p, text in pages().items() if p.read_text() != text]
    assert stale == [], f"stale: {stale}; run: python -m tests.support.docs_gen"


def test_every_error_class_says_what_to_do() -> None:
    from .support.docs_gen import error_classes

    base = error_classes()[0]
    assert base.__name__ == "FitboxError"
    for cls in error_classes():
        assert cls.__doc__, f"{cls.__name__}: no docstring (what happened)"
        assert cls is base or "remedy" in vars(cls), f"{cls.__name__}: no remedy (what to do)"


def test_the_error_scan_finds_codes_given_by_keyword_and_by_helper() -> None:
    codes = {(r.cls, r.code) for r in raised_codes()}
    assert ("PermissionDenied", "host_not_allowed") in codes  # Class(message, code=...)
    assert ("InvalidRequest", "image_too_large") in codes  # _refuse(message, code, param)
    assert ("ModelNotServable", "model_unreadable") in codes  # code=A if x else B


def test_readme_is_one_screen_with_the_ci_command_and_links_into_the_guide() -> None:
    readme = README.read_text()
    assert CI_COMMAND in readme  # .ci/run greps it verbatim
    assert "fitbox pull && .venv/bin/fitbox serve --port 8484" in readme
    assert len(readme.splitlines()) < 80, "README.md is one screen; the guide holds the rest"
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).is_file(), link


def test_no_page_links_outside_the_repository() -> None:
    for page in (REPO / "docs").rglob("*.md"):
        text = page.read_text()
        assert "../shared/" not in text and "shared/DESIGN.md" not in text, page

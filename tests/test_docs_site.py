"""The user guide: the site builds with ``mkdocs build --strict`` (no broken link or anchor,
no page left out of the navigation) and opens in a real Chromium, its reference pages are
what the code's tables write (tests/support/docs_gen.py), and README stays one screen that
points into it. The screenshots of the built site's home page and settings reference are
kept in ``FITBOX_SITE_SHOTS`` (default /tmp): fitbox-site-home.png, fitbox-site-settings.png."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .support.browser import chromium
from .support.docs_gen import pages, raised_codes
from .support.paths import REPO

SHOTS = Path(os.environ.get("FITBOX_SITE_SHOTS", "/tmp"))

README = REPO / "README.md"
CI_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[llama,test]' && .venv/bin/ruff check "
    ". && .venv/bin/ruff format --check . && .venv/bin/mypy && .venv/bin/python -m pytest"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as ``mkdocs build --strict`` writes it; any warning fails the build."""
    out = tmp_path_factory.mktemp("docs") / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output
    assert not re.search(r"^(WARNING|ERROR)\b", output, re.M), output
    return out


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per request on the test's output."""


@contextlib.contextmanager
def served(root: Path) -> Iterator[str]:
    """``root`` over HTTP on a free loopback port, as a reader's browser would fetch it."""
    handler = functools.partial(_Quiet, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_the_site_builds_strict_without_a_warning(site: Path) -> None:
    assert (site / "index.html").is_file()
    for page in ("guide/api", "reference/settings", "reference/routes", "reference/errors"):
        assert (site / page / "index.html").is_file(), page


@pytest.mark.slow
def test_the_built_site_opens_in_chromium(site: Path, tmp_path: Path) -> None:
    with served(site) as url, chromium(tmp_path / "profile") as browser:
        home = browser.open(f"{url}/")
        assert "evict-to-fit" in home.eval("document.body.innerText")
        assert home.eval("document.querySelector('nav.md-nav') !== null")  # Material's theme
        home.screenshot(SHOTS / "fitbox-site-home.png")
        settings = browser.open(f"{url}/reference/settings/")
        rows = settings.eval("document.querySelectorAll('article table tbody tr').length")
        assert rows >= 40, rows
        assert "FITBOX_WAIT_TIMEOUT" in settings.eval("document.body.innerText")
        settings.screenshot(SHOTS / "fitbox-site-settings.png")
    assert (SHOTS / "fitbox-site-home.png").stat().st_size > 10_000
    assert (SHOTS / "fitbox-site-settings.png").stat().st_size > 10_000


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

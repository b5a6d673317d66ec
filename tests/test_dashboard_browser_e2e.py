"""The dashboard as an operator uses it from another machine: a real `fitbox serve` serving
SmolLM2 on the real engine in one network namespace, headless Chromium driven by Playwright
in another (its own address on the bridge: not the box itself, so no key is implied). The
operator signs in with the box's admin key, loads the model with its button, reads an
engine log line, unloads it, sees "disconnected" while the box is stopped (SIGSTOP: the
stream goes quiet without an error) and sees it go once the box runs again.

Playwright (the ``playwright`` Python package, a test tool: its driver only, no browser
download) drives the system's Chromium, started inside the operator's namespace through
``ip netns exec`` (a wrapper script as the executable)."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from fitbox.home import Home

from .support.netns import Namespace, network, start_box_in
from .support.paths import CACHE
from .support.processes import FitboxProcess, stop_fitbox
from .support.tools import required_tool

try:
    from playwright.sync_api import Page, expect, sync_playwright
except ImportError:  # README's test command installs it (the test extra)
    if os.environ.get("FITBOX_REQUIRE_TOOLS"):
        raise
    pytest.skip("playwright is not installed: pip install -e '.[test]'", allow_module_level=True)

pytestmark = pytest.mark.engine
SECONDS = 1000  # Playwright's timeouts are in milliseconds
ARTIFACTS = Path(os.environ.get("FITBOX_TEST_ARTIFACTS", CACHE / "artifacts"))


@pytest.fixture
def spaces() -> Iterator[tuple[Namespace, Namespace]]:
    with network(["fitbox-box", "operator"]) as made:
        yield made.namespaces[0], made.namespaces[1]


@pytest.fixture
def box(
    spaces: tuple[Namespace, Namespace], tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> Iterator[FitboxProcess]:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(smollm2, models / smollm2.name)  # the one model on disk
    env = {"FITBOX_SIMULATED_GPUS": "2GiB", "LLAMA_SERVER_BIN": str(llama_server_bin)}
    started = start_box_in(spaces[0], tmp_path / "home", [models], env=env)
    try:
        yield started
    finally:
        os.kill(started.proc.pid, signal.SIGCONT)  # a failure while it was stopped
        stop_fitbox(started)


def chromium_in(space: Namespace, where: Path) -> Path:
    """An executable that runs the system's Chromium inside ``space``, for Playwright."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        required_tool("chromium", "chromium")
        raise AssertionError("unreachable")
    script = where / "chromium-in-namespace"
    script.write_text(f'#!/bin/sh\nexec ip netns exec {space.name} {found} "$@"\n')
    script.chmod(0o755)
    return script


def test_sign_in_unload_load_read_a_log_and_see_the_box_stop(
    spaces: tuple[Namespace, Namespace], box: FitboxProcess, tmp_path: Path
) -> None:
    executable = chromium_in(spaces[1], tmp_path)
    admin = Home(tmp_path / "home").box_key.read_text().strip()
    url = box.url  # the box's own address on the bridge
    assert spaces[0].address in url
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(executable), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.set_default_timeout(60 * SECONDS)
            sign_in(page, url, admin)
            load_unload_and_read_a_log(page)
            disconnected_while_stopped(page, box)
        finally:
            browser.close()


def sign_in(page: Page, url: str, key: str) -> None:
    page.goto(f"{url}/")
    expect(page).to_have_url(f"{url}/login")  # not signed in: sent to the form
    page.fill("input[name=key]", "fb_wrong_key")
    page.click("button[type=submit]")
    expect(page.locator("p.error")).to_contain_text("not valid")
    page.fill("input[name=key]", key)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{url}/")
    expect(page.locator("h2", has_text="Models on disk")).to_be_visible()
    expect(page.locator(".about .version")).not_to_be_empty()
    cookie = page.context.cookies()[0]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and key not in cookie["value"]


def load_unload_and_read_a_log(page: Page) -> None:
    model = page.locator("tr.model td").first.inner_text()
    expect(page.locator("tr.model .decision")).to_have_text("place")
    page.click(f'tr.model button[data-action="load"][data-model="{model}"]')
    expect(page.locator("#action-result")).to_contain_text("load", timeout=120 * SECONDS)
    ready = page.locator("tr.resident.ready")
    expect(ready).to_have_count(1, timeout=120 * SECONDS)  # shown live, no reload
    log = page.locator(f'.engine-log[data-model="{model}"] pre.log')
    expect(log).not_to_be_empty(timeout=30 * SECONDS)
    assert log.inner_text().strip(), "an engine log line"
    expect(page.locator("tr.resident .idle")).to_have_count(1)
    page.click(f'tr.resident button[data-action="unload"][data-model="{model}"]')
    expect(page.locator("#action-result")).to_contain_text("unload", timeout=60 * SECONDS)
    expect(page.locator("tr.resident")).to_have_count(0, timeout=60 * SECONDS)
    expect(
        page.locator(f'tr.model button[data-action="load"][data-model="{model}"]')
    ).to_be_visible()
    page.click(f'tr.model button[data-action="load"][data-model="{model}"]')
    expect(page.locator("tr.resident.ready")).to_have_count(1, timeout=120 * SECONDS)
    expect(page.locator("#action-result")).not_to_have_class("error")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-signed-in.png"), full_page=True)


def disconnected_while_stopped(page: Page, box: FitboxProcess) -> None:
    banner = page.locator("#disconnected")
    expect(banner).to_be_hidden()
    os.kill(box.proc.pid, signal.SIGSTOP)
    try:
        expect(banner).to_be_visible(timeout=30 * SECONDS)  # three beats heard nothing
    finally:
        os.kill(box.proc.pid, signal.SIGCONT)
    expect(banner).to_be_hidden(timeout=30 * SECONDS)

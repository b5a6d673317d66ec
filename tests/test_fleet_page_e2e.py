"""The central's fleet page and /metrics with real processes on loopback: one `fitbox central
serve` and three `fitbox serve` boxes joined to it, each with a generated tiny llama (real
llama-server children). The page in real headless Chromium shows the three boxes up, and a
call made through the central appears on it without a reload (SSE), with the model loaded
on the box that took it and its idle time, then its eviction when the box unloads it; a
screenshot is kept in the test's tmp dir. With JavaScript off the page shows the same.
/metrics parses with prometheus_client's parser, has series for each box (the call counted
on the box that took it), and passes `promtool check metrics`."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .support.browser import Browser, chromium
from .support.central import Central, worker_key
from .support.ggufs import write_tiny_llama
from .support.holds import HOLD_IDLE_TIMEOUT, Background, until
from .support.processes import FitboxProcess, start_fitbox, stop_fitbox
from .support.tools import required_tool

pytestmark = pytest.mark.engine
TINY = "tiny"
BOXES = "document.querySelectorAll('tr.box')"


@dataclass
class Fleet:
    central: Central
    boxes: list[FitboxProcess]
    ids: list[str]


def _box_id(box: FitboxProcess) -> str:
    return str(httpx.get(f"{box.url}/health", timeout=10).json()["box_id"])


def _all_up(central: Central, ids: list[str]) -> bool:
    fleet = central.fleet()
    return all(fleet.get(i, {}).get("state") == "up" for i in ids)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path) -> Iterator[Fleet]:
    central = Central(tmp_path_factory.mktemp("central"))
    key = worker_key(central.home)
    models = tmp_path_factory.mktemp("models")
    write_tiny_llama(models / f"{TINY}.gguf")
    central.start()
    boxes: list[FitboxProcess] = []
    try:
        homes = [tmp_path_factory.mktemp(f"box-{name}") for name in ("a", "b", "c")]
        join = ("--central", central.url, "--central-key", key)
        starting = [
            Background(lambda h=h: start_fitbox(h, [models], *join, env=HOLD_IDLE_TIMEOUT))  # type: ignore[misc]
            for h in homes
        ]
        for start in starting:
            with contextlib.suppress(Exception):  # one that failed is raised below
                boxes.append(start.result())
        assert len(boxes) == len(homes), [start.result() for start in starting]
        ids = [_box_id(b) for b in boxes]
        until(lambda: _all_up(central, ids), "the three boxes registered and mirrored", 60)
        yield Fleet(central, boxes, ids)
    finally:
        for box in boxes:
            stop_fitbox(box)
        central.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    with chromium(tmp_path_factory.mktemp("chromium") / "profile") as running:
        yield running


def _chat(central: Central) -> str:
    """A call through the central; the id of the box that took it."""
    answer = httpx.post(
        f"{central.url}/v1/chat/completions",
        json={"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    return answer.headers["x-fitbox-box"]


def test_three_boxes_and_a_call_shown_without_a_reload(
    fleet: Fleet, browser: Browser, tmp_path: Path
) -> None:
    page = browser.open(f"{fleet.central.url}/")
    assert page.eval(f"{BOXES}.length") == 3
    states = page.eval(f"[...{BOXES}].map(r => r.cells[2].textContent)")
    assert states == ["up", "up", "up"]
    shown_ids = page.eval(f"[...{BOXES}].map(r => r.cells[1].textContent)")
    assert sorted(shown_ids) == sorted(fleet.ids)
    calls_before = page.eval("document.querySelectorAll('tr.call').length")
    page.eval("window.notReloaded = true")  # gone if the page were loaded again
    took = _chat(fleet.central)
    page.wait_for(
        f"document.querySelectorAll('tr.call').length === {calls_before + 1}",
        "the call on the page",
        60,
    )
    assert page.eval("window.notReloaded") is True
    # the three boxes share a host name: each is shown with the start of its id
    name = f"{fleet.central.fleet()[took]['name']} ({took[:8]})"
    call = page.eval("[...document.querySelector('tr.call').cells].map(c => c.textContent)")
    assert call[0] == name and call[3] == TINY and call[4] == "ok"
    page.wait_for(
        "[...document.querySelectorAll('tr.resident.ready')].some(r => "
        f"r.cells[0].textContent === {name!r} && r.cells[1].textContent === {TINY!r} && "
        "r.cells[6].textContent.startsWith('idle for'))",
        "the model loaded on the box that took the call, idle since it",
        60,
    )
    shot = tmp_path / "fleet-page.png"
    page.screenshot(shot)
    assert shot.stat().st_size > 1000
    print(f"fleet page screenshot: {shot}")
    box = fleet.boxes[fleet.ids.index(took)]
    unloaded = httpx.post(f"{box.url}/v1/operator/unload", json={"model": TINY}, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    page.wait_for(
        f"[...document.querySelectorAll('h2')].find(h => h.textContent === 'Evictions')"
        f".nextElementSibling.rows?.[1]?.cells[0].textContent === {name!r}",
        "the eviction on the page",
        60,
    )
    assert page.eval("document.querySelectorAll('tr.resident').length") == 0
    assert page.eval("window.notReloaded") is True


def test_the_same_page_with_javascript_off(fleet: Fleet, browser: Browser) -> None:
    page = browser.open(f"{fleet.central.url}/", javascript=False)
    assert sorted(page.eval(f"[...{BOXES}].map(r => r.cells[1].textContent)")) == sorted(fleet.ids)
    assert page.eval("document.querySelectorAll('.device').length") >= 3  # each box's host


def test_metrics_have_each_box_and_pass_promtool(fleet: Fleet) -> None:
    took = _chat(fleet.central)

    def counted() -> str | None:
        text = httpx.get(f"{fleet.central.url}/metrics", timeout=30).text
        found = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        done = found.get(("fitbox_central_calls_total", (("box", took), ("outcome", "ok"))), 0)
        key = ("fitbox_central_residents", (("box", took), ("model", TINY), ("state", "ready")))
        return text if done >= 1 and found.get(key) == 1 else None

    text = until(counted, "the call counted and the model ready on the box that took it", 60)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("fitbox_central_box_up", "fitbox_central_box_state", "fitbox_central_box_info"):
        assert {s.labels["box"] for s in families[name].samples} == set(fleet.ids), name
    up = {s.labels["box"]: s.value for s in families["fitbox_central_box_up"].samples}
    assert up == dict.fromkeys(fleet.ids, 1.0)
    held = families["fitbox_central_device_held_bytes"].samples
    assert any(s.labels["box"] == took and s.value > 0 for s in held)
    free = families["fitbox_central_device_free_bytes"].samples
    assert {s.labels["box"] for s in free} == set(fleet.ids)  # each box's readings, mirrored
    promtool = required_tool("promtool", "prometheus")
    checked = subprocess.run(
        [str(promtool), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

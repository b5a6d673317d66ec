"""The live dashboard at /, opened in real headless Chromium against a real fitbox serving
SmolLM2 on the real engine: residents, device bars and calls in the DOM, a new call shown
without a reload (SSE), the same page with JavaScript off (a reload shows it), everything a
client chose escaped, and the outside refused without an admin key."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .support.browser import Browser, Page, chromium
from .support.holds import GATED, until
from .support.paths import CACHE
from .support.processes import FitboxProcess, running_fitbox, start_fitbox, stop_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
CLIENT = "127.0.0.3"  # a peer that is not the box itself
ARTIFACTS = Path(os.environ.get("FITBOX_TEST_ARTIFACTS", CACHE / "artifacts"))


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine's load gate (tests/fakes/gated-llama-server): open unless a test shuts it."""
    gate = tmp_path_factory.mktemp("gate") / "load-gate"
    gate.touch()
    return gate


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path, gate: Path
) -> Iterator[FitboxProcess]:
    home = tmp_path_factory.mktemp("dashboard") / "home"
    env = {
        "FITBOX_SIMULATED_GPUS": "2GiB",
        "LLAMA_SERVER_BIN": str(GATED),
        "FAKE_REAL_LLAMA_SERVER": str(llama_server_bin),
        "FAKE_LOAD_GATE": str(gate),
    }
    with running_fitbox(home, [smollm2.parent], env=env) as running:
        yield running


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    with chromium(tmp_path_factory.mktemp("chromium") / "profile") as running:
        yield running


def chat(box: FitboxProcess, model: str = "smollm2") -> httpx.Response:
    return httpx.post(
        f"{box.url}/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 3,
        },
        timeout=120,
    )


def call_ids(page: Page) -> list[int]:
    found: list[str] = page.eval(
        "[...document.querySelectorAll('tr.call')].map(r => r.cells[0].textContent)"
    )
    return [int(i) for i in found]


def newest_call(box: FitboxProcess) -> int:
    rows = httpx.get(
        f"{box.url}/v1/telemetry/rows",
        params={"table": "call_log", "order": "id", "desc": "true", "limit": 1},
    ).json()["rows"]
    newest: int = rows[0]["id"]
    return newest


def test_residents_devices_and_a_new_call_without_a_reload(
    box: FitboxProcess, browser: Browser
) -> None:
    assert chat(box).status_code == 200
    page = browser.open(f"{box.url}/")
    resident = page.eval(
        "[...document.querySelectorAll('tr.resident')].map(r => "
        "[...r.cells].slice(0, 3).map(c => c.textContent))"
    )
    assert resident == [[SMOL, "ready", "gpu0"]]
    bar = page.eval(
        "(() => { const s = document.querySelector("
        "'.device[data-device=gpu0] .seg'); return s && [s.dataset.model, "
        "parseFloat(s.style.width)]; })()"
    )
    assert bar[0] == SMOL and 0 < bar[1] <= 100
    assert page.eval("document.querySelector('.device[data-device=gpu0] b').textContent") == (
        "gpu0 (gpu, simulated)"
    )
    first = newest_call(box)
    assert call_ids(page)[0] == first
    timings = page.eval("[...document.querySelector('tr.call').cells].map(c => c.textContent)")
    assert timings[3] == "ok" and all(t.endswith(" ms") for t in timings[6:10] if t)
    assert chat(box).status_code == 200  # a second call: shown by SSE, no reload
    page.wait_for(
        f"document.querySelector('tr.call').cells[0].textContent === '{first + 1}'",
        "the new call on the page",
    )
    assert call_ids(page)[:2] == [first + 1, first]
    page.screenshot(ARTIFACTS / "dashboard.png")
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 1000


def test_javascript_off_a_reload_shows_the_same(box: FitboxProcess, browser: Browser) -> None:
    assert chat(box).status_code == 200
    page = browser.open(f"{box.url}/", javascript=False)
    assert page.eval("document.querySelector('tr.resident').cells[0].textContent") == SMOL
    before = newest_call(box)
    assert call_ids(page)[0] == before
    assert chat(box).status_code == 200
    page.reload()
    assert call_ids(page)[0] == before + 1


def test_what_a_client_chose_is_escaped(box: FitboxProcess, browser: Browser) -> None:
    name = '<img src=x onerror="document.title=1">\nx'
    assert chat(box, name).status_code == 404
    page = browser.open(f"{box.url}/")
    assert page.eval("document.querySelectorAll('main img').length") == 0
    shown = page.eval("document.querySelector('tr.call').cells[2].textContent")
    assert shown == name
    assert page.eval("document.title") == "fitbox"


def test_a_refusal_and_an_eviction_with_their_reasons(box: FitboxProcess, browser: Browser) -> None:
    assert chat(box).status_code == 200
    page = browser.open(f"{box.url}/")
    assert (
        httpx.post(
            f"{box.url}/v1/operator/unload", json={"model": "smollm2"}, timeout=60
        ).status_code
        == 200
    )
    page.wait_for("document.querySelectorAll('tr.resident').length === 0", "the unload shown")
    evictions = page.eval(
        "[...document.querySelectorAll('h2')].find(h => h.textContent === "
        "'Evictions').nextElementSibling.rows[1].cells[2].textContent"
    )
    assert evictions == "operator"
    limits = httpx.post(f"{box.url}/v1/limits", json={"ram_max": "64MiB", "vram_max": "64MiB"})
    assert limits.status_code == 200
    try:
        assert chat(box).status_code == 507
    finally:
        httpx.post(f"{box.url}/v1/limits", json={"ram_max": None, "vram_max": None})
    page.wait_for(
        "[...document.querySelectorAll('h2')].find(h => h.textContent === "
        "'Refusals').nextElementSibling.tagName === 'TABLE'",
        "the refusal shown",
    )
    reason = page.eval(
        "[...document.querySelectorAll('h2')].find(h => h.textContent === "
        "'Refusals').nextElementSibling.rows[1].cells[4].textContent"
    )
    assert reason == "larger_than_box"


def test_the_outside_needs_a_key(box: FitboxProcess) -> None:
    outside = httpx.HTTPTransport(local_address=CLIENT)
    with httpx.Client(transport=outside, timeout=30) as client:
        for path in ("/", "/dashboard/events"):
            refused = client.get(f"{box.url}{path}")
            assert refused.status_code == 401, path
            assert refused.json()["error"]["code"] == "missing_api_key"
        # a browser (it asks for HTML) is sent to the sign-in form instead
        sent = client.get(f"{box.url}/", headers={"Accept": "text/html"})
        assert sent.status_code == 303 and sent.headers["location"] == "/login"
        box_key = (box.home / "box.key").read_text().strip()
        page = client.get(f"{box.url}/", headers={"Authorization": f"Bearer {box_key}"})
        assert page.status_code == 200 and "<h2>Residents</h2>" in page.text


LOADED = "document.querySelector('tr.resident.starting .loaded')"


def test_a_load_shows_the_bytes_read_with_javascript_on_and_off(
    box: FitboxProcess, browser: Browser, gate: Path, smollm2: Path
) -> None:
    """The load is held by the engine's load gate (the real engine reads its weights; its
    /health says "Loading model" until the test opens the gate)."""
    if box.models()[SMOL]["state"] != "unloaded":  # (the refusal's test may have left it out)
        assert (
            httpx.post(
                f"{box.url}/v1/operator/unload", json={"model": "smollm2"}, timeout=60
            ).status_code
            == 200
        )
    until(lambda: box.models()[SMOL]["state"] == "unloaded", "the model is out")
    gate.unlink()
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 3,
        "stream": True,
    }
    try:
        with httpx.stream(
            "POST", f"{box.url}/v1/chat/completions", json=body, timeout=120
        ) as reply:
            assert reply.status_code == 200  # the 200 came; the load is held
            live = browser.open(f"{box.url}/")
            # bytes read so far, moved on by the event stream (the first render may show 0)
            live.wait_for(
                f"{LOADED} && Number({LOADED}.dataset.bytesLoaded) > 0",
                "bytes read shown while loading",
            )
            loaded, total = live.eval(
                f"[{LOADED}.dataset.bytesLoaded, {LOADED}.dataset.bytesTotal].map(Number)"
            )
            assert 0 < loaded <= total <= smollm2.stat().st_size
            words = live.eval(f"{LOADED}.textContent")
            assert " of " in words and words.endswith("%)")
            bar = live.eval(
                "[...document.querySelectorAll('tr.resident progress')].map(p => [p.value, p.max])"
            )
            assert len(bar) == 1 and 0 < bar[0][0] <= bar[0][1] == total
            live.screenshot(ARTIFACTS / "dashboard-loading.png")
            still = browser.open(f"{box.url}/", javascript=False)  # the page as served
            assert still.eval(f"Number({LOADED}.dataset.bytesTotal)") == total
            assert still.eval("document.querySelector('tr.resident progress').max") == total
            gate.touch()
            assert [line for line in reply.iter_lines() if line][-1] == "data: [DONE]"
        live.wait_for(
            f"!{LOADED} && document.querySelector('tr.resident.ready') !== null",
            "the load done, its bytes gone from the page",
        )
    finally:
        gate.touch()


def test_a_stop_ends_an_open_event_stream_at_once(tmp_path: Path) -> None:
    """An open dashboard never holds a stop for uvicorn's grace period: the stream ends when
    the stop signal comes, and the page's EventSource reconnects to the next fitbox."""
    box = start_fitbox(tmp_path / "home", [tmp_path / "models"])
    try:
        with (
            httpx.Client(timeout=60) as client,
            client.stream(
                "GET",
                f"{box.url}/dashboard/events",  # no since: the first update comes at once
            ) as events,
        ):
            assert events.status_code == 200
            assert events.headers["content-type"].startswith("text/event-stream")
            lines = events.iter_lines()
            assert next(lines) == "event: update"
            box.proc.send_signal(signal.SIGTERM)
            rest = list(lines)  # ends when fitbox ends the stream
        assert not [line for line in rest if line.startswith("event:")]
    finally:
        stop_fitbox(box)
    assert "graceful shutdown exceeded" not in box.log()
    assert "Application shutdown complete" in box.log()

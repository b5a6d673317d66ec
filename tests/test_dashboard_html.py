"""The dashboard's HTML from a view, without a box: a loading resident's progress, a device
bar's shares, and escaping (attributes and text alike)."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from fitbox.server.views import dashboard_html
from fitbox.server.views.dashboard_html import DeviceView, View


def resident(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "state": "ready",
        "device": "gpu0",
        "rung": "gpu-only",
        "window": 4096,
        "bytes": 1 << 30,
        "basis": "estimate",
        "calls": 0,
        "pinned": False,
        "load_seconds": None,
        "load_started_at": None,
        **extra,
    }


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def parsed(text: str) -> list[tuple[str, dict[str, str | None]]]:
    tags = Tags()
    tags.feed(text)
    return tags.tags


def view(**extra: Any) -> View:
    values: dict[str, Any] = {
        "counter": 7,
        "devices": [],
        "residents": [],
        "queue": [],
        "calls": [],
        "evictions": [],
        "refusals": [],
        "now": 1000.0,
    }
    values.update(extra)
    return View(**values)


def test_a_loading_resident_shows_its_seconds_so_far() -> None:
    text = dashboard_html.main(view(residents=[resident(state="starting", load_started_at=988.0)]))
    (span,) = [a for t, a in parsed(text) if t == "span"]
    assert span["data-loading-since"] == "988.000"
    assert "loading for 12 s" in text


def test_a_loading_resident_shows_the_bytes_of_its_weights_read() -> None:
    loading = resident(
        state="starting", load_started_at=988.0, bytes_loaded=3 << 28, bytes_total=1 << 30
    )
    text = dashboard_html.main(view(residents=[loading]))
    tags = dict(parsed(text)[::-1])  # the first of each tag
    assert tags["progress"] == {"value": str(3 << 28), "max": str(1 << 30)}
    assert "loading for 12 s" in text and "768.00 MiB of 1.00 GiB (75%)" in text
    # before the child has read a byte, or when its file cannot be read: seconds only
    assert "<progress" not in dashboard_html.main(
        view(residents=[resident(state="starting", load_started_at=988.0)])
    )


def test_a_device_bar_is_shared_by_what_each_resident_holds() -> None:
    device = DeviceView(
        "gpu0", "gpu", 4 << 30, True, [("a", "ready", 1 << 30), ("b", "starting", 2 << 30)]
    )
    segs = [
        a
        for t, a in parsed(dashboard_html.main(view(devices=[device])))
        if t == "div" and "seg" in (a.get("class") or "")
    ]
    assert [(s["data-model"], s["style"]) for s in segs] == [
        ("a", "width:25.00%"),
        ("b", "width:50.00%"),
    ]
    assert segs[1]["class"] == "seg starting"


def test_everything_a_client_chose_is_escaped_and_one_line() -> None:
    evil = '"><script>alert(1)</script>\n<img src=x>'
    device = DeviceView("gpu0", "gpu", 1 << 30, False, [(evil, "ready", 1 << 20)])
    calls = [
        {
            "id": 1,
            "received_at": 999.0,
            "model_asked": evil,
            "outcome": "error",
            "error_code": "model_not_found",
            "http_status": 404,
        }
    ]
    text = dashboard_html.main(view(devices=[device], calls=calls))
    assert "<script" not in text and "<img" not in text
    assert "\n" not in text  # an SSE data line cannot carry a raw line break
    assert [t for t, _ in parsed(text)].count("div") == 3  # the device, its bar, one segment


def test_what_health_says_to_fix_is_on_the_dashboard_and_escaped() -> None:
    problem = "the store file /home/<x>/fitbox.sqlite3 was deleted while fitbox ran"
    text = dashboard_html.main(view(problems=[problem]))
    assert "Problems" in text and "/home/&lt;x&gt;/fitbox.sqlite3 was deleted" in text
    assert "Problems" not in dashboard_html.main(view())


EVIL = '"><script>alert(1)</script>\n<img src=x>'


def catalog_entry() -> dict[str, Any]:
    plan = {"decision": "place", "rung": "gpu-only", "window": 4096}
    plan["devices"] = [{"device": "gpu0", "total_bytes": 1 << 30}]
    return {"model": "m", "state": "unloaded", "plan": plan, "lines": ["m: place", "  why"]}


def test_the_catalog_says_each_model_s_plan_and_only_an_admin_gets_buttons() -> None:
    failed = {"model": EVIL, "state": "failed", "error": EVIL}
    shown = dashboard_html.main(view(catalog=[catalog_entry(), failed], admin=True))
    assert "Models on disk" in shown and "1.00 GiB" in shown and "gpu-only" in shown
    buttons = [(a["data-action"], a["data-model"]) for t, a in parsed(shown) if t == "button"]
    assert buttons == [("load", "m"), ("pin", "m"), ("clear-failed", EVIL)]
    assert "<script" not in shown and "<img" not in shown and "\n" not in shown
    looked = dashboard_html.main(view(catalog=[catalog_entry(), failed], residents=[resident()]))
    assert "<button" not in looked and "Models on disk" in looked  # a read key only looks
    acted = dashboard_html.main(view(residents=[resident(pinned=True)], admin=True))
    assert [a["data-action"] for t, a in parsed(acted) if t == "button"] == ["unload", "unpin"]


def test_countdowns_idle_times_and_uptime_are_served_with_their_times() -> None:
    queued = [{"call_id": 3, "model": "m", "since": 990.0, "deadline": 1030.0}]
    idle = resident(idle_for_s=75.0)
    text = dashboard_html.main(
        view(queue=queued, residents=[idle], version="1.2.3", started_at=400.0)
    )
    tags = parsed(text)
    assert ("span", {"data-deadline": "1030.000"}) in tags and "30 s" in text
    assert ("span", {"class": "idle", "data-since": "925.000"}) in tags and "75 s" in text
    assert "1.2.3" in text and ("span", {"class": "uptime", "data-since": "400.000"}) in tags
    assert 'data-now="1000.000"' in text  # the box's clock: the page corrects for its own


def test_engine_log_lines_are_an_admin_s_and_escaped() -> None:
    logs = {"m": ("m-1.log", ["listening on http://127.0.0.1:1234", EVIL])}
    shown = dashboard_html.main(view(logs=logs, admin=True))
    assert "Engine logs" in shown and "listening on http://127.0.0.1:1234" in shown
    assert "<script" not in shown and 'href="/v1/logs/m-1.log"' in shown
    assert "Engine logs" not in dashboard_html.main(view(logs=logs))


def test_the_page_holds_the_csrf_token_and_a_hidden_disconnected_banner() -> None:
    page = dashboard_html.page(view(), csrf='t"<')
    tags = parsed(page)
    assert ("meta", {"name": "csrf-token", "content": 't"<'}) in tags
    assert ("div", {"id": "disconnected", "role": "alert", "hidden": None}) in tags
    assert ("input", {"type": "hidden", "name": "csrf", "value": 't"<'}) in tags
    assert '<meta name="csrf-token"' not in dashboard_html.page(view())  # the box itself

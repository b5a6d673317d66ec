"""The dashboard's sign-in, in process, from a browser on another machine: /login with a key
answers a session cookie (HttpOnly, SameSite=Strict, Secure over https, never the key), the
session grants exactly its key's scope, a change made with it needs its CSRF token and the
box's own Origin, a revoked key ends it at once, and /logout ends it."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fitbox import config
from fitbox.server.door.sessions import COOKIE, Sessions
from fitbox.server.views import dashboard, dashboard_html
from fitbox.store.keys import ApiKey, revoke_key

from .support.clients import app_client, make_key
from .support.ggufs import write_tiny_llama

OUTSIDE, PROXY = ("203.0.113.5", 5000), ("10.9.9.9", 5000)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "models").mkdir()
    write_tiny_llama(tmp_path / "models" / "tiny.gguf")
    with browser(tmp_path):
        pass  # the first start migrates the store
    yield tmp_path


def browser(home: Path, peer: tuple[str, int] = OUTSIDE, **settings: str) -> TestClient:
    cfg = config.load({"home": str(home), "models": str(home / "models"), **settings}, env={})
    return app_client(cfg, peer, follow_redirects=False)


def sign_in(client: TestClient, key: str) -> str:
    """Signs ``client`` in with ``key``; the page's CSRF token."""
    answer = client.post("/login", data={"key": key})
    assert answer.status_code == 303 and answer.headers["location"] == "/", answer.text
    page = client.get("/")
    assert page.status_code == 200, page.text
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text)
    assert found, page.text
    return found.group(1)


def test_a_browser_elsewhere_is_sent_to_sign_in_and_in_with_a_key(home: Path) -> None:
    admin = make_key(home, "admin")
    with browser(home) as client:
        first = client.get("/", headers={"accept": "text/html"})
        assert first.status_code == 303 and first.headers["location"] == "/login"
        assert client.get("/").status_code == 401  # a script (no HTML asked) hears why
        form = client.get("/login")
        assert form.status_code == 200 and 'name="key"' in form.text
        answer = client.post("/login", data={"key": admin})
        cookie = answer.headers["set-cookie"]
        flags = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/"} <= flags and "secure" not in flags
        assert admin not in cookie and admin.split("_")[2] not in cookie
        assert len(cookie.split(";")[0].split("=", 1)[1]) >= 40  # token_urlsafe(32)
        page = client.get("/")
        assert page.status_code == 200 and "Models on disk" in page.text
        assert 'data-action="load"' in page.text and "tiny" in page.text
        assert "csrf-token" in page.text and "Sign out" in page.text
        assert client.get("/calls").status_code == 200  # not loopback-only any more
        assert client.get("/v1/logs").status_code == 200
        # elsewhere the cookie is no key
        assert client.get("/v1/keys").status_code == 401
        assert client.get("/v1/telemetry/tables").status_code == 401


def test_a_wrong_key_gets_the_form_again_with_401(home: Path) -> None:
    inference = make_key(home, "inference")
    with browser(home) as client:
        for wrong in ("fb_nope_nope", "hunter2", inference, ""):
            answer = client.post("/login", data={"key": wrong})
            assert answer.status_code == 401 and 'name="key"' in answer.text
            assert "set-cookie" not in answer.headers and 'class="error"' in answer.text
        assert client.get("/").status_code == 401


def test_the_cookie_is_secure_behind_a_trusted_https_proxy(home: Path) -> None:
    admin = make_key(home, "admin")
    with browser(home, PROXY, trusted_proxies="10.9.9.9/32") as client:
        forwarded = {"x-forwarded-proto": "https", "x-forwarded-for": "203.0.113.5"}
        answer = client.post("/login", data={"key": admin}, headers=forwarded)
        assert answer.status_code == 303
        assert "secure" in answer.headers["set-cookie"].lower()


def test_a_change_needs_the_csrf_token_and_the_box_s_origin(home: Path) -> None:
    admin = make_key(home, "admin")
    with browser(home) as client:
        csrf = sign_in(client, admin)
        body = {"model": "tiny"}
        refused = client.post("/v1/operator/clear-failed", json=body)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "csrf_failed"
        wrong = client.post("/v1/operator/clear-failed", json=body, headers={"x-csrf-token": "x"})
        assert wrong.json()["error"]["code"] == "csrf_failed"
        other = {"x-csrf-token": csrf, "origin": "http://evil.example"}
        answer = client.post("/v1/operator/clear-failed", json=body, headers=other)
        assert answer.status_code == 403
        assert answer.json()["error"]["code"] == "origin_not_allowed"
        own = {"x-csrf-token": csrf, "origin": "http://127.0.0.1"}
        answer = client.post("/v1/operator/clear-failed", json=body, headers=own)
        assert answer.status_code == 409, answer.text  # admitted: tiny is not marked failed
        assert answer.json()["error"]["code"] == "not_failed"


def test_a_read_session_views_and_cannot_act(home: Path) -> None:
    read = make_key(home, "read")
    with browser(home) as client:
        csrf = sign_in(client, read)
        page = client.get("/")
        assert "Models on disk" in page.text and "data-action=" not in page.text
        assert "Engine logs" not in page.text
        answer = client.post(
            "/v1/operator/load", json={"model": "tiny"}, headers={"x-csrf-token": csrf}
        )
        assert answer.status_code == 403 and answer.json()["error"]["type"] == "permission_error"
        assert client.get("/v1/logs").status_code == 403
        assert client.get("/calls").status_code == 403


def test_a_revoked_key_ends_its_session_at_once(home: Path) -> None:
    admin = make_key(home, "admin")
    with browser(home) as client:
        sign_in(client, admin)
        with sqlite3.connect(home / "fitbox.sqlite3") as conn:
            revoke_key(conn, admin.split("_")[1])
        assert client.get("/").status_code == 401
        assert client.get("/calls").status_code == 401
        sessions: Sessions = client.app.state.gate.sessions  # type: ignore[attr-defined]
        assert len(sessions) == 0  # dropped, not only refused


def test_sign_out_ends_the_session(home: Path) -> None:
    admin = make_key(home, "admin")
    with browser(home) as client:
        csrf = sign_in(client, admin)
        kept = client.cookies.get(COOKIE)
        refused = client.post("/logout", data={"csrf": "wrong"})
        assert refused.status_code == 403
        answer = client.post("/logout", data={"csrf": csrf})
        assert answer.status_code == 303 and answer.headers["location"] == "/login"
        assert "max-age=0" in answer.headers["set-cookie"].lower()
        client.cookies.set(COOKIE, kept or "")  # a copy of the old cookie opens nothing now
        assert client.get("/").status_code == 401


def test_another_site_cannot_sign_the_browser_in(home: Path) -> None:
    admin = make_key(home, "admin")
    with browser(home) as client:
        answer = client.post(
            "/login", data={"key": admin}, headers={"origin": "http://evil.example"}
        )
        assert answer.status_code == 403 and "set-cookie" not in answer.headers


def test_an_idle_session_expires() -> None:
    sessions = Sessions(idle_s=-1.0)
    opened = sessions.open(ApiKey("k", "n", ("admin",), None, 0.0, None, None, False))
    assert sessions.find(opened.id) is None and len(sessions) == 0
    assert sessions.find(None) is None and sessions.find("nothing") is None


def test_an_open_stream_ends_at_the_beat_after_its_key_is_revoked(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard_html, "BEAT_S", 0.05)
    monkeypatch.setattr(dashboard, "BEAT_S", 0.05)
    admin = make_key(home, "admin")
    with browser(home) as client:
        sign_in(client, admin)
        counter = re.search(r'data-counter="(\d+)"', client.get("/").text)
        assert counter is not None
        answers: list[bytes] = []

        def watch() -> None:  # the page's stream: it ends only when the box ends it
            answers.append(client.get(f"/dashboard/events?since={counter.group(1)}").content)

        watching = threading.Thread(target=watch, daemon=True)
        watching.start()
        time.sleep(0.3)
        assert watching.is_alive()  # beats, and nothing else, while the key stands
        with sqlite3.connect(home / "fitbox.sqlite3") as conn:
            revoke_key(conn, admin.split("_")[1])
        watching.join(timeout=30)
        assert not watching.is_alive() and b"event: beat" in answers[0]

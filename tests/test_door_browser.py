"""A web page in a browser against the door: a keyless state-changing call from another
page's Origin is refused on every route, inference included (server/door/browser.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fitbox import config
from fitbox.errors import PermissionDenied
from fitbox.networks import DEFAULT_TRUSTED_NETWORKS, parse_networks
from fitbox.server.door.browser import check_origin, served_scheme
from fitbox.server.door.trust import TrustSettings

from .support.clients import app_client, assert_error
from .support.ggufs import write_tiny_llama
from .support.paths import BOX

LOCAL, LAN = ("127.0.0.1", 5000), ("192.168.7.7", 5000)
SETTINGS = TrustSettings(parse_networks(DEFAULT_TRUSTED_NETWORKS), (), "127.0.0.1")
# a chat that names no model of the box: past the door it is a 404, never a load
CHAT = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    write_tiny_llama(tmp_path / "models" / "tiny.gguf")
    return tmp_path


def client(home: Path, peer: tuple[str, int], **settings: str) -> TestClient:
    cfg = config.load({"home": str(home), "models": str(home / "models"), **settings}, env={})
    return app_client(cfg, peer)


def simple_post(web: TestClient, path: str, origin: str) -> Any:
    """What any page can send without a preflight: a text/plain POST."""
    return web.post(
        path,
        content=b'{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}',
        headers={"Content-Type": "text/plain", "Origin": origin},
    )


@pytest.mark.parametrize("peer", [LOCAL, LAN])
def test_another_page_cannot_send_inference_without_a_key(
    home: Path, peer: tuple[str, int]
) -> None:
    """A page anywhere could otherwise load a model and evict the operator's idle one."""
    with client(home, peer) as web:
        for origin in ("http://evil.example", "https://127.0.0.1", "http://127.0.0.1:3000"):
            refused = simple_post(web, "/v1/chat/completions", origin)
            body = assert_error(refused, 403, "origin_not_allowed")
            assert origin in str(body["message"]) and body["param"] == "origin"
        own = simple_post(web, "/v1/chat/completions", BOX)  # the box's own page
        assert_error(own, 404, "model_not_found")
        scripted = web.post("/v1/chat/completions", json=CHAT)  # no Origin: curl, an SDK
        assert_error(scripted, 404, "model_not_found")


def test_a_key_decides_for_itself_whatever_the_origin(home: Path) -> None:
    with client(home, LOCAL) as web:
        box_key = (home / "box.key").read_text().strip()
        keyed = web.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={"Origin": "http://evil.example", "Authorization": f"Bearer {box_key}"},
        )
        assert_error(keyed, 404, "model_not_found")


def test_an_https_origin_is_not_an_http_box_for_management(home: Path) -> None:
    """Only the netloc was compared: https://127.0.0.1 passed for an http box."""
    with client(home, LOCAL) as web:
        refused = web.post("/v1/keys", json={"name": "x"}, headers={"Origin": "https://127.0.0.1"})
        assert_error(refused, 403, "origin_not_allowed")
        own = web.post(
            "/v1/keys", json={"name": "mine", "scopes": ["read"]}, headers={"Origin": BOX}
        )
        assert own.status_code == 201, own.text


def test_a_listed_cors_origin_may_call_without_a_key(home: Path) -> None:
    with client(home, LOCAL, cors_origins="https://app.example") as web:
        listed = simple_post(web, "/v1/chat/completions", "https://app.example")
        assert_error(listed, 404, "model_not_found")
        other = simple_post(web, "/v1/chat/completions", "http://app.example")
        assert_error(other, 403, "origin_not_allowed")


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "allowed"),
    [
        ("http://127.0.0.1:8484", "127.0.0.1:8484", "http", True),
        ("http://box.example", "box.example:80", "http", True),  # the default port, named
        ("https://box.example", "box.example", "https", True),
        ("https://box.example", "box.example", "http", False),
        ("http://box.example:8080", "box.example", "http", False),
        ("http://[::1]:8484", "[::1]:8484", "http", True),
        ("http://other.example:8484", "box.example:8484", "http", False),
        ("null", "127.0.0.1:8484", "http", False),
        ("http://127.0.0.1:notaport", "127.0.0.1:8484", "http", False),
    ],
)
def test_origin_is_scheme_host_and_port(origin: str, host: str, scheme: str, allowed: bool) -> None:
    headers = {"origin": origin, "host": host}
    if allowed:
        check_origin(headers, "POST", SETTINGS, scheme)
    else:
        with pytest.raises(PermissionDenied):
            check_origin(headers, "POST", SETTINGS, scheme)
    check_origin(headers, "GET", SETTINGS, scheme)  # a read changes nothing


def test_only_a_trusted_proxy_says_the_scheme() -> None:
    behind = TrustSettings((), parse_networks("10.0.0.2/32"), "127.0.0.1")
    https = {"x-forwarded-proto": "https"}
    assert served_scheme("http", "10.0.0.2", https, behind) == "https"
    assert served_scheme("http", "10.0.0.3", https, behind) == "http"
    assert served_scheme("http", "10.0.0.2", {"x-forwarded-proto": "gopher"}, behind) == "http"

"""Clients of a box: the app in process (with its lifespan, as a local caller) and the
OpenAI SDK pointed at a running fitbox."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import openai
from starlette.testclient import TestClient

from fitbox.config import Config
from fitbox.server.app import create_app
from fitbox.store.keys import create_key

from .paths import BOX

# a caller on the box itself: loopback, as the box's own browser or a local script
LOOPBACK = ("127.0.0.1", 50000)


def app_client(config: Config, peer: tuple[str, int] = LOOPBACK, **options: Any) -> TestClient:
    """The app built from ``config``, called in process from ``peer`` at the box's own Host.
    Use it as a context manager to run the app's lifespan (the Box opens and closes)."""
    return TestClient(create_app(config), base_url=BOX, client=peer, **options)


def make_key(
    home: Path, *scopes: str, models: tuple[str, ...] | None = None, expires_at: float | None = None
) -> str:
    """A key's secret, made in the store of the box whose home is ``home`` (started once)."""
    with sqlite3.connect(home / "fitbox.sqlite3") as conn:
        return create_key(conn, "test", scopes, models, expires_at)[1]


def openai_client(url: str, api_key: str = "unused", **options: Any) -> openai.OpenAI:
    """The OpenAI SDK at a running fitbox (``url`` as FitboxProcess.url has it)."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, **options)


def assert_error(response: Any, status: int, code: str) -> dict[str, object]:
    """``response`` is the error envelope OpenAI's clients read, with this status and code."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert {"message", "type", "code", "param"} <= set(error)
    assert error["code"] == code and error["message"]
    return dict(error)


def call_rows(client: TestClient) -> list[dict[str, Any]]:
    """The in-process box's call log, every row written."""
    store = client.app.state.store  # type: ignore[attr-defined]
    store.flush()
    with sqlite3.connect(store.path) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM call_log ORDER BY id")]

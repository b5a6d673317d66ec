"""Client mistakes are 4xx with a reason, in-process: no engine is launched for them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fitbox import config

from .support.clients import app_client, assert_error, call_rows
from .support.ggufs import write_tiny_llama


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    cfg = config.load(
        {"home": str(tmp_path / "home"), "models": str(models)},
        env={"FITBOX_SIMULATED_GPUS": ""},
    )
    with app_client(cfg) as test_client:
        yield test_client


@pytest.mark.parametrize(
    ("path", "extra"),
    [("/v1/chat/completions", {}), ("/v1/messages", {"max_tokens": 8})],
)
def test_an_empty_conversation_is_refused_not_generated_to_the_window(
    client: TestClient, path: str, extra: dict[str, int]
) -> None:
    """llama-server answers ``messages: []`` as a bare generation prompt (and, without
    max_tokens, writes until its window is full); OpenAI and Anthropic refuse it."""
    response = client.post(path, json={"model": "tiny", "messages": [], **extra})
    error = assert_error(response, 400, "empty_array")
    assert error["param"] == "messages" and error["type"] == "invalid_request_error"
    assert client.get("/v1/residents").json()["data"] == []  # nothing was loaded
    assert call_rows(client)[-1]["outcome"] == "error"


@pytest.mark.parametrize("spec", ["not-a-spec", "box://host/model", "box://h:99999/m"])
def test_a_malformed_pull_spec_is_a_400_naming_the_shape(client: TestClient, spec: str) -> None:
    response = client.post("/v1/operator/pull-model", json={"model": spec})
    error = assert_error(response, 400, "invalid_pull_spec")
    assert error["param"] == "model" and "box://HOST:PORT/MODEL" in str(error["message"])

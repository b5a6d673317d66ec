"""Slots and prompt sizes, end to end on real llama-server and SmolLM2 (issue #15).

One fitbox for the module, its engine behind the gated fake (tests/support/holds.py) with the gate
open, so one test can close it and hold every reply after its first event. SmolLM2 was
trained on 8192 tokens; here fitbox prefers a 512 window (the issue's case is 6,000 tokens
over a preferred 4096: the same rule, scaled so the prompt is read in seconds on two
shared cores) and gives a child 4 unified slots (the default FITBOX_PARALLEL), each of
which may fill the whole window.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fitbox.core.prompts import prompt_bound
from fitbox.engines.child import free_port
from fitbox.models.templates import chat_template_bytes

from .support.clients import openai_client
from .support.holds import HOLD_IDLE_TIMEOUT, Background, engine_logs, gated_engine, resident, until
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
TRAINED = 8192
PREFERRED = 512
HOLDING = "fake: holding a reply"
TASK = "processing task"  # llama-server's log line for each task a slot takes


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gate") / "open"
    path.touch()
    return path


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path, gate: Path
) -> Iterator[FitboxProcess]:
    env = {
        **gated_engine(llama_server_bin, gate),
        **HOLD_IDLE_TIMEOUT,
        "FITBOX_CTX": str(PREFERRED),
    }
    with running_fitbox(tmp_path_factory.mktemp("home"), [smollm2.parent], env=env) as running:
        yield running


def client(box: FitboxProcess) -> openai.OpenAI:
    return openai_client(box.url, max_retries=0, timeout=300)


def words(n: int) -> str:
    """About ``n`` SmolLM2 tokens of plain text (one per word, give or take)."""
    vocabulary = ["apple", "river", "stone", "cloud", "green", "table", "light", "house"]
    return " ".join(vocabulary[i % len(vocabulary)] for i in range(n))


def post(box: FitboxProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{box.url}/v1/chat/completions", json=body, timeout=300)


def test_a_long_prompt_on_a_fresh_box_gets_a_larger_window(box: FitboxProcess) -> None:
    """700 tokens do not fit the preferred 512 window; the model can load 8192. The
    first test of the module, so nothing is resident: the prompt is sized by its bound,
    placed at a window that holds it, and counted by the engine once loaded."""
    assert box.models()[SMOL]["resident"] is False
    reply = post(
        box, {"model": SMOL, "max_tokens": 4, "messages": [{"role": "user", "content": words(700)}]}
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] > PREFERRED
    loaded = resident(box, SMOL)
    assert loaded["window"] > PREFERRED and loaded["parallel"] == 4 and loaded["kv_unified"]


@pytest.mark.parametrize(
    ("path", "field"), [("/v1/chat/completions", "messages"), ("/v1/responses", "input")]
)
def test_a_prompt_no_window_holds_is_refused_with_both_numbers(
    box: FitboxProcess, path: str, field: str
) -> None:
    """The refusal names the field the prompt came in (the Responses API's is ``input``)."""
    prompt = words(9000)
    body: dict[str, Any] = (
        {"max_tokens": 4, "messages": [{"role": "user", "content": prompt}]}
        if field == "messages"
        else {"max_output_tokens": 4, "input": prompt}
    )
    reply = httpx.post(f"{box.url}{path}", json={"model": SMOL, **body}, timeout=300)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["code"] == "context_length_exceeded" and error["param"] == field
    assert error["n_ctx"] == TRAINED and error["n_prompt_tokens"] > TRAINED
    assert reply.headers["x-should-retry"] == "false"
    assert set(error) >= {"message", "type", "code", "param"}


def test_n_2_returns_two_choices(box: FitboxProcess) -> None:
    reply = client(box).chat.completions.create(
        model=SMOL, n=2, max_tokens=8, messages=[{"role": "user", "content": "Hello"}]
    )
    assert sorted(c.index for c in reply.choices) == [0, 1]
    assert all(c.message.content is not None for c in reply.choices)


def test_n_above_the_slots_is_refused_before_the_engine(box: FitboxProcess) -> None:
    before = engine_logs(box).count(TASK)
    reply = post(
        box,
        {
            "model": SMOL,
            "n": 5,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hello"}],
        },
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (
        "n",
        "n_above_slots",
        "invalid_request_error",
    )
    assert "at most 4" in error["message"] and reply.headers["x-should-retry"] == "false"
    assert before and engine_logs(box).count(TASK) == before


def test_four_streams_run_in_parallel_on_one_resident(box: FitboxProcess, gate: Path) -> None:
    """The gate closed, each reply is held after its first event: four replies all held at
    once means the engine produced a first token for each while none had finished. One
    slot would give the second call nothing until the first was let through."""
    gate.unlink()  # the fake logs a line for each reply it really holds, none before

    def stream() -> str:
        chunks = client(box).chat.completions.create(
            model=SMOL,
            max_tokens=8,
            stream=True,
            extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": "Count to ten."}],
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    try:
        streams = [Background(stream) for _ in range(4)]  # each starts on its own
        until(
            lambda: engine_logs(box).count(HOLDING) == 4,
            "four replies held at the gate at once",
        )
        assert resident(box, SMOL)["calls"] == 4
    finally:
        gate.touch()
    assert all(s.result() for s in streams)


# -- the bound never below the truth -------------------------------------------------------


@pytest.fixture(scope="module")
def engine(smollm2: Path, llama_server_bin: Path) -> Iterator[str]:
    """SmolLM2 in a llama-server of its own: the truth the bound is held to."""
    port = free_port()
    proc = subprocess.Popen(
        [
            str(llama_server_bin),
            "-m",
            str(smollm2),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            "512",
            "-np",
            "1",
            "--no-webui",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: _healthy(url), "the engine answering /health")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        parsed: dict[str, Any] = json.loads(reply.read())
        return parsed


def _truth(url: str, body: dict[str, Any]) -> int:
    """The engine's own count, as fitbox asks it (engines/llama_server.py count_prompt)."""
    prompt = _post(url, "/apply-template", body)["prompt"]
    tokens = _post(
        url, "/tokenize", {"content": prompt, "add_special": True, "parse_special": True}
    )["tokens"]
    return len(tokens)


texts = st.text(st.characters(codec="utf-8"), max_size=300)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": texts}
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chat=messages, specials=st.booleans())
def test_the_prompt_bound_is_never_below_the_tokenizer(
    engine: str, smollm2: Path, chat: list[dict[str, str]], specials: bool
) -> None:
    chat = [*chat, {"role": "user", "content": chat[-1]["content"]}]  # what a call ends with
    if specials:  # text that spells the template's own special tokens
        chat = [{**m, "content": m["content"] + "<|im_start|><|im_end|>"} for m in chat]
    body = {"model": SMOL, "messages": chat}
    assert _truth(engine, body) <= prompt_bound(body, chat_template_bytes(smollm2))

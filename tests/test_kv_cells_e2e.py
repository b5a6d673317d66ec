"""Calls admitted by the cells of a shared KV pool, not by slots alone (issue #35), end to end
on real llama-server and SmolLM2.

A child has 4 unified slots (``--kv-unified``): every call may use the whole window, and
they all share its cells. Here the window is small (768 cells: the first call's prompt
bound, over a preferred 512) and each prompt a little over half of it, so one call fits
alone and two do not fit together. Sent to llama-server itself at once, both fail
("Context size has been exceeded": whole, a 500; streamed, a 200 and then an error event).
Through fitbox the second waits at the door, in /v1/queue, until the first gives its cells
back, and both are answered.

The engine runs behind the gated fake (tests/support/holds.py), its gate open but for the
test that holds the first call's reply at it: that call keeps its cells for as long as the
test wants, whatever the machine's speed, so the second one is seen waiting.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support.holds import (
    HOLD_IDLE_TIMEOUT,
    SAFETY_S,
    Background,
    engine_logs,
    gated_engine,
    resident,
    until,
)
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
PREFERRED = 512
TEMPLATE = 30  # tokens the chat template adds to a one-message prompt, about
HOLDING = "fake: holding a reply"


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gate") / "open"
    path.touch()
    return path


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path, gate: Path
) -> Iterator[FitboxProcess]:
    env = {**gated_engine(llama_server_bin, gate), **HOLD_IDLE_TIMEOUT}
    env["FITBOX_CTX"] = str(PREFERRED)
    with running_fitbox(tmp_path_factory.mktemp("home"), [smollm2.parent], env=env) as running:
        warm = chat(running, "Hello", stream=False)  # loads the model at a small window
        assert warm[0] == 200, warm
        yield running


@pytest.fixture(scope="module")
def pool(box: FitboxProcess) -> int:
    """The cells the resident's calls share: its window (a multiple of 256 here, as
    llama.cpp pads it), which the resident shows as ``cells`` while it serves."""
    cells = int(resident(box, SMOL)["window"])
    assert cells < 1024  # small, so each prompt is read in seconds on two shared cores
    return cells


def prompt(pool: int, offset: int) -> str:
    """A prompt of ~0.55 of the pool: with its 8-token reply one fits, two do not."""
    return words(pool * 55 // 100 - TEMPLATE, offset)


def words(n: int, offset: int) -> str:
    """About ``n`` SmolLM2 tokens of plain text; a different ``offset``, a different text
    (no prompt cache shared between the two calls)."""
    vocabulary = ["apple", "river", "stone", "cloud", "green", "table", "light", "house"]
    return " ".join(vocabulary[(i + offset) % len(vocabulary)] for i in range(n))


def chat(box: FitboxProcess, content: str, stream: bool) -> tuple[int, str]:
    """(status, the reply's text, or the error it ended with)."""
    body = {
        "model": SMOL,
        "max_tokens": 8,
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
    }
    url = f"{box.url}/v1/chat/completions"
    if not stream:
        reply = httpx.post(url, json=body, timeout=SAFETY_S)
        if reply.status_code != 200:
            return reply.status_code, reply.text
        return 200, reply.json()["choices"][0]["message"]["content"]
    text = []
    with httpx.stream("POST", url, json=body, timeout=SAFETY_S) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            if '"error"' in line:
                return 500, line  # an engine error event after the 200
            text += [c["delta"].get("content") or "" for c in _choices(line)]
        return reply.status_code, "".join(text)


def _choices(line: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(line[len("data: ") :]).get("choices") or []
    return found


def queued(box: FitboxProcess) -> list[dict[str, Any]]:
    answer = httpx.get(f"{box.url}/v1/queue", headers=box.headers, timeout=30)
    return [q for q in answer.json()["data"] if q["model"] == SMOL]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_two_prompts_that_fit_alone_are_both_answered_when_sent_at_once(
    box: FitboxProcess, pool: int, stream: bool
) -> None:
    """Released together by a barrier: on llama-server alone both fail; here both answer."""
    start = threading.Barrier(2)

    def call(offset: int) -> tuple[int, str]:
        start.wait()
        return chat(box, prompt(pool, offset), stream)

    calls = [Background(functools.partial(call, offset)) for offset in (1, 4)]
    answers = [c.result() for c in calls]
    assert [status for status, _ in answers] == [200, 200], answers
    assert all(text for _, text in answers), answers


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_second_waits_in_the_queue_for_the_cells_of_the_first(
    box: FitboxProcess, gate: Path, pool: int, stream: bool
) -> None:
    """The first call's reply held at the gate keeps its cells; the second, which would not
    fit beside it, waits in /v1/queue (with what it needs and what is held) and goes once
    the first is let through."""
    held = engine_logs(box).count(HOLDING)
    gate.unlink()
    try:
        first = Background(lambda: chat(box, prompt(pool, 2), stream))
        until(lambda: engine_logs(box).count(HOLDING) > held, "the first reply held")
        taken = resident(box, SMOL)
        assert taken["calls"] == 1 and taken["cells"] == pool
        second = Background(lambda: chat(box, prompt(pool, 5), stream))
        until(  # either: waiting at the door, or (wrongly) on the engine beside the first
            lambda: queued(box) or resident(box, SMOL)["calls"] > 1,
            "the second call waiting in /v1/queue",
        )
        (waiting,) = queued(box)
        assert waiting["blocked_by"] == [SMOL] and "eta_s" in waiting
        cells = waiting["cells"]
        assert cells["pool"] == pool and cells["held"] == taken["cells_taken"]
        assert cells["need"] <= pool < cells["need"] + cells["held"], cells
        assert resident(box, SMOL)["calls"] == 1  # the second never reached the engine
    finally:
        gate.touch()
    answers = [first.result(), second.result()]
    assert [status for status, _ in answers] == [200, 200], answers
    assert all(text for _, text in answers), answers
    assert not queued(box)


def test_a_call_whose_cells_never_free_within_its_wait_is_told_the_numbers(
    box: FitboxProcess, gate: Path, pool: int
) -> None:
    """The first call's reply held at the gate for as long as the test wants; the second's
    wait (a 1 s max wait for this model) runs out while it does: a 503 model_busy naming
    the cells it needed, the pool and what was held, never a failure in the engine."""
    pair = f"{box.url}/v1/settings/pair"
    assert httpx.post(pair, json={"model": SMOL, "max_wait": 1}, timeout=30).is_success
    held = engine_logs(box).count(HOLDING)
    gate.unlink()
    try:
        first = Background(lambda: chat(box, prompt(pool, 3), stream=False))
        until(lambda: engine_logs(box).count(HOLDING) > held, "the first reply held")
        message = {"role": "user", "content": prompt(pool, 6)}
        body = {"model": SMOL, "max_tokens": 8, "messages": [message]}
        busy = httpx.post(f"{box.url}/v1/chat/completions", json=body, timeout=SAFETY_S)
    finally:
        gate.touch()
        httpx.post(pair, json={"model": SMOL, "max_wait": None}, timeout=30)
    assert busy.status_code == 503, busy.text
    error = busy.json()["error"]
    assert error["code"] == "model_busy" and f"of the {pool} KV cells" in error["message"]
    assert "max_tokens" in error["message"] and busy.headers.get("retry-after")
    assert first.result()[0] == 200

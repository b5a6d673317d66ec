"""fitbox as users run it: a real `fitbox serve` process, real llama-server children, real
GGUF files, and the official openai client."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import psutil
import pytest
from openai.types.chat import ChatCompletionMessageParam

from fitbox.core import sizing
from fitbox.core.slots import choose
from fitbox.models.gguf_facts import read_facts

from .support.clients import openai_client
from .support.ggufs import write_tiny_llama
from .support.holds import (
    HOLD_IDLE_TIMEOUT,
    Background,
    calls_on,
    engine_logs,
    engine_stopped,
    gated_engine,
    until,
)
from .support.processes import FitboxProcess, running_fitbox, start_fitbox, stop_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
DEFAULT_SLOTS = 4  # FITBOX_PARALLEL's default
HELLO: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Say hello in one short sentence."}
]


def footprint(path: Path, window: int = 4096, parallel: int = DEFAULT_SLOTS) -> int:
    """As fitbox prices it: ``parallel`` slots, unified when more than one."""
    shape, slots = read_facts(path).shape, choose(parallel)
    return sizing.footprint(
        shape, sizing.effective_window(shape, window), slots.count, unified=slots.unified
    ).total


_clients: list[openai.OpenAI] = []


def client_for(box: FitboxProcess) -> openai.OpenAI:
    client = openai_client(box.url, max_retries=0)
    _clients.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _clients:  # an unclosed socket would warn later, inside some other test
        _clients.pop().close()


@pytest.fixture(scope="module")
def smol_box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[FitboxProcess]:
    with running_fitbox(tmp_path_factory.mktemp("home"), [smollm2.parent]) as box:
        yield box


def test_openai_client_chats(smol_box: FitboxProcess) -> None:
    reply = client_for(smol_box).chat.completions.create(
        model=SMOL,
        messages=HELLO,
        max_tokens=24,
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert smol_box.models()[SMOL]["resident"] is True


def test_openai_client_streams_in_several_chunks_as_they_are_made(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """The gated fake holds the engine's reply after its first event until the test opens
    the gate: that event reaching the client first shows fitbox passes events on as they
    come, not once the reply is whole, whatever the machine's speed."""
    gate = tmp_path / "gate"
    with running_fitbox(
        tmp_path / "home", [smollm2.parent], env=gated_engine(llama_server_bin, gate)
    ) as box:
        stream = (
            client_for(box)
            .with_options(timeout=60)
            .chat.completions.create(
                model=SMOL,
                messages=HELLO,
                max_tokens=48,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
        )
        chunks = iter(stream)
        first = next(chunks)  # while the rest of the reply is held at the gate
        until(lambda: "holding a reply" in engine_logs(box), "the fake holding the reply")
        gate.touch()
        rest = list(chunks)
    text = "".join(c.choices[0].delta.content or "" for c in [first, *rest] if c.choices)
    usage = next((c.usage for c in rest if c.usage), None)
    assert text
    assert len(rest) >= 9  # the first event came alone; the others followed the gate
    assert usage is not None and usage.completion_tokens == 48


def test_unknown_model_is_a_typed_404(smol_box: FitboxProcess) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client_for(smol_box).chat.completions.create(
            model="no-such-model",
            messages=HELLO,
        )
    assert caught.value.code == "model_not_found"
    assert isinstance(caught.value.body, dict) and SMOL in caught.value.body["message"]


def test_bad_requests_are_typed_400s(smol_box: FitboxProcess) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(smol_box).chat.completions.create(
            model=SMOL,
            messages=cast(Any, None),
        )
    assert caught.value.code == "invalid_request"
    response = httpx.post(
        f"{smol_box.url}/v1/chat/completions",
        content=b'{"model": ',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_engine_errors_arrive_in_the_openai_envelope(smol_box: FitboxProcess) -> None:
    response = httpx.post(
        f"{smol_box.url}/v1/embeddings", json={"model": SMOL, "input": "hi"}, timeout=60
    )
    error = response.json()["error"]
    assert response.status_code >= 400 and set(error) == {"message", "type", "code", "param"}
    assert isinstance(error["code"], str) and error["message"]
    # longer than the model was trained on: no reload could help, the engine refuses it
    too_long = {"model": SMOL, "prompt": "word " * 12000, "max_tokens": 1}
    response = httpx.post(f"{smol_box.url}/v1/completions", json=too_long, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and isinstance(error["code"], str)
    assert "context" in error["message"]


def test_every_call_has_a_row(smol_box: FitboxProcess) -> None:
    rows = smol_box.calls()
    served = [r for r in rows if r["outcome"] == "ok"]
    assert served and all(r["prompt_tokens"] and r["completion_tokens"] for r in served)
    assert all(r["received_at"] <= r["admitted_at"] <= r["last_byte_at"] for r in served)
    assert any(r["error_code"] == "model_not_found" for r in rows)


@pytest.fixture
def two_models(tmp_path: Path, smollm2: Path, llama_server_bin: Path) -> tuple[Path, int]:
    """SmolLM2 and a tiny llama in one root, and a RAM cap that holds either but not both."""
    root = tmp_path / "models"
    root.mkdir()
    try:
        os.link(smollm2, root / smollm2.name)
    except OSError:  # another filesystem
        shutil.copy(smollm2, root / smollm2.name)
    # ~26 MB: more than SmolLM2's estimate exceeds its measurement, so the cap below holds
    # either model but never both, whether each is priced by estimate or by measurement
    write_tiny_llama(root / "tiny.gguf", extra_vocab=50_000)
    a, b = footprint(root / smollm2.name), footprint(root / "tiny.gguf")
    return root, max(a, b) + min(a, b) // 2


def test_evict_to_fit_alternates_two_models_within_the_cap(
    tmp_path: Path, two_models: tuple[Path, int]
) -> None:
    root, cap = two_models
    with running_fitbox(tmp_path / "home", [root], "--ram-max", str(cap)) as box:
        client = client_for(box)
        for model in [SMOL, "tiny", SMOL, "tiny"]:
            reply = client.chat.completions.create(
                model=model,
                messages=HELLO,
                max_tokens=8,
            )
            assert reply.choices[0].message.content is not None
            resident = [m for m in box.models().values() if m["resident"]]
            assert [m["id"] for m in resident] == [model]
            assert sum(int(str(m["footprint_bytes"])) for m in resident) <= cap
        evicted = [json.loads(str(r["evicted"])) for r in box.calls() if r["evicted"]]
        assert [SMOL] in evicted and ["tiny"] in evicted


def test_a_streaming_call_finishes_before_its_model_is_evicted(
    tmp_path: Path, two_models: tuple[Path, int]
) -> None:
    root, cap = two_models
    with running_fitbox(
        tmp_path / "home", [root], "--ram-max", str(cap), env=HOLD_IDLE_TIMEOUT
    ) as box:
        client = client_for(box)
        assert client.chat.completions.create(model=SMOL, messages=HELLO, max_tokens=1)

        def stream_a() -> tuple[str | None, Any]:
            finish, usage = None, None
            for chunk in client.chat.completions.create(
                model=SMOL,
                messages=HELLO,
                max_tokens=128,
                stream=True,
                extra_body={"ignore_eos": True},
                stream_options={"include_usage": True},
            ):
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
                if chunk.usage:
                    usage = chunk.usage
            return finish, usage

        # A's engine is stopped: A holds SmolLM2 until the test lets it go, so B (which needs
        # SmolLM2's room) is seen waiting for it however fast the machine generates
        with engine_stopped(box, SMOL):
            a = Background(stream_a)
            until(lambda: calls_on(box, SMOL) == 1, "A's call on SmolLM2")
            b = Background(
                lambda: client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=4)
            )
            queued = until(
                lambda: httpx.get(f"{box.url}/v1/queue").json()["data"], "B waiting for A's room"
            )
        finish, usage = a.result()
        assert b.result().choices[0].message.content is not None
        assert [(q["model"], q["blocked_by"]) for q in queued] == [("tiny", [SMOL])]
        assert finish == "length" and usage is not None and usage.completion_tokens == 128
        rows = {r["model_asked"]: r for r in box.calls()}  # the last row of each model
        a_row, b_row = rows[SMOL], rows["tiny"]
        assert json.loads(str(b_row["evicted"])) == [SMOL]
        assert float(str(b_row["load_start_at"])) >= float(str(a_row["last_byte_at"]))


def test_a_model_too_big_for_the_box_is_refused_and_nothing_is_evicted(
    tmp_path: Path, two_models: tuple[Path, int]
) -> None:
    root, _ = two_models
    cap = footprint(root / "tiny.gguf") + (1 << 20)
    with running_fitbox(tmp_path / "home", [root], "--ram-max", str(cap)) as box:
        client = client_for(box)
        client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2)
        with pytest.raises(openai.APIStatusError) as caught:  # a prompt of a few tokens:
            client.completions.create(model=SMOL, prompt="Hi")  # the smallest window holds it
        assert caught.value.status_code == 507
        body = caught.value.body
        assert isinstance(body, dict) and body["code"] == "does_not_fit"
        # priced at the smallest window the call allows: no window at all would fit
        assert body["needed_bytes"] == footprint(root / f"{SMOL}.gguf", window=512)
        assert "512-token window" in body["message"]
        assert body["available_bytes"] == cap
        assert box.models()["tiny"]["resident"] is True


def test_an_engine_that_cannot_load_is_engine_failed_with_its_log(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "no-vocab.gguf", with_tokenizer=False)
    with running_fitbox(tmp_path / "home", [root]) as box:
        response = httpx.post(
            f"{box.url}/v1/chat/completions",
            timeout=120,
            json={"model": "no-vocab", "messages": HELLO},
        )
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["code"] == "engine_failed"
        assert any("vocab" in line or "tokenizer" in line for line in error["log_tail"])
        assert box.models()["no-vocab"]["resident"] is False


def _children(box: FitboxProcess) -> list[psutil.Process]:
    return psutil.Process(box.proc.pid).children(recursive=True)


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _group_gone(group: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_children_do_not_outlive_fitbox(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path, sig: signal.Signals
) -> None:
    box = start_fitbox(tmp_path / "home", [smollm2.parent])
    try:
        client_for(box).chat.completions.create(
            model=SMOL,
            messages=HELLO,
            max_tokens=2,
        )
        children = _children(box)
        assert children, "a resident model should have a llama-server child"
        group = os.getpgid(children[0].pid)
        assert group != os.getpgid(box.proc.pid)  # the child leads its own process group
        started = time.monotonic()
        box.proc.send_signal(sig)
        box.proc.wait(timeout=20)
        assert all(_gone(c.pid, 15 - (time.monotonic() - started)) for c in children)
        assert _group_gone(group, 15 - (time.monotonic() - started))
    finally:
        stop_fitbox(box)

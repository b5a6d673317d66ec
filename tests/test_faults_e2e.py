"""Faults a user will meet, injected into a real fitbox: an engine that dies mid-stream, an
engine that hangs at load, room that stays busy past the wait bound, simulated GPUs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from fitbox.core import sizing
from fitbox.models.gguf_facts import read_facts

from .support.ggufs import write_tiny_llama
from .support.holds import (
    HOLD_IDLE_TIMEOUT,
    SAFETY_S,
    Background,
    calls_on,
    engine_logs,
    engine_stopped,
    gated_engine,
    resident,
    until,
)
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
HANGING = Path(__file__).parent / "fakes" / "hanging-llama-server"


def chat(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "Tell me a story."}], **extra}


def engine_pids(box: FitboxProcess) -> list[int]:
    return [p.pid for p in psutil.Process(box.proc.pid).children(recursive=True)]


def loading(box: FitboxProcess) -> list[int]:
    """Engines launched for a load: on a port of their own (a probe of the binary starts
    on ``--port 0``)."""
    found = []
    for child in psutil.Process(box.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            argv = child.cmdline()
            if "--port" in argv[:-1] and argv[argv.index("--port") + 1] != "0":
                found.append(child.pid)
    return found


def stream_lines(box: FitboxProcess, body: dict[str, object]) -> list[str]:
    """The non-empty lines of a streamed reply, read to its end."""
    with httpx.stream("POST", f"{box.url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line]


def signal_engines_mid_stream(
    box: FitboxProcess, sig: signal.Signals
) -> tuple[list[str], list[int]]:
    """Stream a long reply; on its fifth event send ``sig`` to every engine. The signal is the
    test's own event: it lands mid-stream unless the engine made the other 1995 tokens in
    the moment between sending that event and the test reading it. Returns the data events
    and the engine pids signalled."""
    body = chat(SMOL, max_tokens=2000, stream=True, ignore_eos=True)
    events: list[str] = []
    signalled: list[int] = []
    with httpx.stream("POST", f"{box.url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 5:
                signalled = engine_pids(box)
                for pid in signalled:
                    os.kill(pid, sig)
    return events, signalled


def test_an_engine_dying_mid_stream_ends_the_stream_with_an_error_event(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    with running_fitbox(tmp_path / "home", [smollm2.parent]) as box:
        events, _ = signal_engines_mid_stream(box, signal.SIGKILL)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "engine_failed" and "failed mid-call" in error["message"]
        row = box.calls()[-1]
        assert (row["outcome"], row["error_code"]) == ("error", "engine_failed")
        # the dead resident is dropped and the next call loads the model again
        again = httpx.post(
            f"{box.url}/v1/chat/completions", json=chat(SMOL, max_tokens=4), timeout=60
        )
        assert again.status_code == 200, again.text


def test_an_engine_that_hangs_at_load_is_killed_and_reported(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    env = {"LLAMA_SERVER_BIN": str(HANGING), "FITBOX_LOAD_TIMEOUT": "2", "FITBOX_STOP_GRACE": "1"}
    with running_fitbox(tmp_path / "home", [tiny_gguf.parent], env=env) as box:
        # not a hang: the reply comes within the client's 15 s bound (2 s to load, 1 s of
        # grace, SIGKILL) and names the 2 s it was given (the default is 300 s)
        response = httpx.post(f"{box.url}/v1/chat/completions", json=chat("tiny-llama"), timeout=15)
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["code"] == "engine_failed" and "not ready after 2 s" in error["message"]
        assert any("never finishing" in line for line in error["log_tail"])
        assert engine_pids(box) == []  # the fake ignored SIGTERM; the group got SIGKILL


def test_a_call_that_cannot_get_room_in_time_is_a_503_and_the_busy_model_serves_on(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    shutil.copy(smollm2, root / smollm2.name)
    write_tiny_llama(root / "tiny.gguf", extra_vocab=50_000)  # see test_serve_e2e.two_models
    shapes = [read_facts(p).shape for p in sorted(root.iterdir())]
    sizes = [sizing.footprint(s, sizing.effective_window(s, 4096), 1).total for s in shapes]
    cap = max(sizes) + min(sizes) // 2
    env = {"FITBOX_WAIT_TIMEOUT": "1", **HOLD_IDLE_TIMEOUT}
    with running_fitbox(tmp_path / "home", [root], "--ram-max", str(cap), env=env) as box:
        assert (
            httpx.post(
                f"{box.url}/v1/chat/completions", json=chat(SMOL, max_tokens=2), timeout=60
            ).status_code
            == 200
        )
        # a stream on SmolLM2 whose engine is stopped: it serves until the test lets it go,
        # however fast the machine; tiny needs its room and waits its 1 s bound in vain
        body = chat(SMOL, max_tokens=64, stream=True, ignore_eos=True)
        with engine_stopped(box, SMOL):
            streaming = Background(lambda: stream_lines(box, body))
            until(lambda: calls_on(box, SMOL) == 1, "the stream's call on SmolLM2")
            busy = httpx.post(
                f"{box.url}/v1/chat/completions", timeout=60, json=chat("tiny", max_tokens=2)
            )
        lines = streaming.result()
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "model_busy"
        assert SMOL in busy.json()["error"]["message"]
        assert lines[-1] == "data: [DONE]" and "error" not in "".join(lines[-3:])


def test_a_simulated_gpu_is_labelled_and_used(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    env = {"FITBOX_SIMULATED_GPUS": "1GiB"}
    with running_fitbox(tmp_path / "home", [tiny_gguf.parent], env=env) as box:
        gpus = httpx.get(f"{box.url}/health").json()["gpus"]
        assert gpus == [
            {"index": 0, "name": "simulated GPU 0", "total_bytes": 1 << 30, "simulated": True}
        ]
        response = httpx.post(
            f"{box.url}/v1/chat/completions", json=chat("tiny-llama", max_tokens=2), timeout=60
        )
        assert response.status_code == 200
        assert response.headers["x-fitbox-device"] == "gpu0"
        model = box.models()["tiny-llama"]
        assert model["device"] == "gpu0" and model["simulated"] is True
        assert "SIMULATED" in box.log()


def test_a_crash_loop_backs_off_then_marks_the_model_failed_until_cleared(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "broken.gguf", with_tokenizer=False)  # the real engine rejects it
    env = {"FITBOX_CRASH_LIMIT": "3", "FITBOX_CRASH_BACKOFF": "0.2"}
    with running_fitbox(tmp_path / "home", [root], env=env) as box:
        body = chat("broken", max_tokens=1)
        started = time.monotonic()
        for _ in range(3):
            response = httpx.post(f"{box.url}/v1/chat/completions", json=body, timeout=60)
            assert response.status_code == 502
            assert "could not load" in response.json()["error"]["message"]
        assert time.monotonic() - started >= 0.2 + 0.4  # backed off 0.2 s, then 0.4 s
        launches = len(list((tmp_path / "home" / "logs").glob("broken-*.log")))
        assert launches == 3
        refused = httpx.post(f"{box.url}/v1/chat/completions", json=body, timeout=60)
        error = refused.json()["error"]
        assert refused.status_code == 502 and "marked failed after 3 crashes" in error["message"]
        assert error["log_tail"] and box.models()["broken"]["state"] == "failed"
        assert len(list((tmp_path / "home" / "logs").glob("broken-*.log"))) == launches
        cleared = httpx.post(f"{box.url}/v1/operator/clear-failed", json={"model": "broken"})
        assert cleared.status_code == 200
        again = httpx.post(f"{box.url}/v1/chat/completions", json=body, timeout=60)
        assert again.status_code == 502 and "could not load" in again.json()["error"]["message"]
        not_failed = httpx.post(f"{box.url}/v1/operator/clear-failed", json={"model": "broken"})
        assert not_failed.status_code == 409


OOM = Path(__file__).parent / "fakes" / "oom-llama-server"


def test_an_out_of_memory_load_refuses_its_window_and_the_same_call_loads_smaller(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    env = {
        "LLAMA_SERVER_BIN": str(OOM),
        "FAKE_REAL_LLAMA_SERVER": str(llama_server_bin),
        "FAKE_OOM_AT_CTX": "8192",
        "FITBOX_CTX": "8192",
    }
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        response = httpx.post(
            f"{box.url}/v1/chat/completions", timeout=60, json=chat(SMOL, max_tokens=2)
        )
        assert response.status_code == 200, response.text  # the same request, placed again
        (resident,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
        assert resident["window"] == 6144  # the tick below the refused 8192
        assert "ran out of memory at a 8192-token window" in box.log()
        plan = httpx.get(f"{box.url}/v1/plan", params={"model": SMOL}).json()
        assert plan["band"]["max"] == 6144  # out of reach until a load at 8192 succeeds
        models = {m["id"]: m for m in httpx.get(f"{box.url}/v1/models").json()["data"]}
        assert models[SMOL].get("failed") in (None, False)  # room, not a crash: never failed
        (fact,) = httpx.get(f"{box.url}/v1/telemetry", params={"table": "refused_windows"}).json()[
            "rows"
        ]
        assert (fact["window"], fact["placement"]) == (8192, "host")
        assert "failed to allocate" in fact["detail"] and fact["call_id"] == box.calls()[0]["id"]
    # the fact outlives the process: the next fitbox does not try 8192 again
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        plan = httpx.get(f"{box.url}/v1/plan", params={"model": SMOL}).json()
        assert plan["band"]["max"] == 6144


def test_an_engine_that_hangs_mid_call_ends_it_with_engine_timeout_and_is_restarted(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """SIGSTOP makes a real llama-server hang on demand: no byte, no answer to /health."""
    env = {"FITBOX_ENGINE_IDLE_TIMEOUT": "1", "FITBOX_STOP_GRACE": "1"}
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        events, stopped = signal_engines_mid_stream(box, signal.SIGSTOP)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "engine_timeout"
        # the 1 s quiet bound it was given (the default is 60 s), then a failed health probe
        assert "sent nothing for 1 s and did not answer its health probe" in error["message"]
        assert stopped and not any(
            psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            for p in stopped
        )
        row = box.calls()[-1]
        assert (row["outcome"], row["error_code"]) == ("error", "engine_timeout")
        # the next call loads the model again
        again = httpx.post(
            f"{box.url}/v1/chat/completions", timeout=60, json=chat(SMOL, max_tokens=4)
        )
        assert again.status_code == 200, again.text
        assert box.log().count("hung: nothing for") == 1
        # and a hang before the first byte of a whole (non-stream) reply is a 504
        for pid in engine_pids(box):
            os.kill(pid, signal.SIGSTOP)
        hung = httpx.post(
            f"{box.url}/v1/chat/completions", timeout=60, json=chat(SMOL, max_tokens=4)
        )
        assert hung.status_code == 504 and hung.json()["error"]["code"] == "engine_timeout"
        assert "hung: nothing for 1 s" in box.log()


def test_a_busy_engine_that_answers_its_health_probe_is_waited_for_not_restarted(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """A whole reply held silent by the gated fake past the quiet bound, twice: each time the
    watchdog probes /health the engine answers, and the call is waited for again. The test
    opens the gate; how fast the machine generates does not enter into it."""
    gate = tmp_path / "gate"
    env = {**gated_engine(llama_server_bin, gate), "FITBOX_ENGINE_IDLE_TIMEOUT": "2"}
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        reply = Background(
            lambda: httpx.post(
                f"{box.url}/v1/chat/completions",
                timeout=120,
                json=chat(SMOL, max_tokens=8, ignore_eos=True),
            )
        )
        until(
            lambda: engine_logs(box).count("answered /health while holding") >= 2,
            "two health probes while the reply is held",
        )
        pid = resident(box, SMOL)["pid"]
        gate.touch()
        response = reply.result()
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 8
        assert "hung" not in box.log() and resident(box, SMOL)["pid"] == pid  # never restarted
        assert box.calls()[-1]["outcome"] == "ok"


def test_kill_9_mid_stream_then_restart_leaves_no_child_and_an_interrupted_row(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    from .support.processes import start_fitbox, stop_fitbox

    home = tmp_path / "home"
    box = start_fitbox(home, [smollm2.parent])
    try:
        body = chat(SMOL, max_tokens=2000, stream=True, ignore_eos=True)
        children: list[int] = []
        with (
            pytest.raises(httpx.HTTPError),
            httpx.stream(
                "POST", f"{box.url}/v1/chat/completions", json=body, timeout=30
            ) as response,
        ):
            for n, _ in enumerate(response.iter_lines()):
                if n == 5:
                    children = engine_pids(box)
                    box.proc.kill()  # kill -9: no cleanup runs in fitbox
        box.proc.wait(timeout=10)
        until(
            lambda: (
                not any(
                    psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                    for p in children
                )
            ),
            "the engine gone after a kill -9 of fitbox",
        )
    finally:
        stop_fitbox(box)
    with running_fitbox(home, [smollm2.parent]) as again:
        calls = again.calls()
        assert [c["outcome"] for c in calls] == ["interrupted"]  # closed at start, not lost
        reply = httpx.post(
            f"{again.url}/v1/chat/completions", json=chat(SMOL, max_tokens=2), timeout=60
        )
        assert reply.status_code == 200
        assert len(engine_pids(again)) == 1  # one child for the model, no duplicate
        store = httpx.get(f"{again.url}/health").json()["store"]
        assert store["damaged_file_set_aside"] is None  # the store survived the kill intact


def test_sigterm_during_a_load_that_never_finishes_stops_everything_within_15_s(
    tmp_path: Path, tiny_gguf: Path
) -> None:
    from .support.processes import start_fitbox, stop_fitbox

    env = {"LLAMA_SERVER_BIN": str(HANGING), "FITBOX_LOAD_TIMEOUT": "300"}
    box = start_fitbox(tmp_path / "home", [tiny_gguf.parent], env=env)
    try:
        caller = threading.Thread(
            target=lambda: httpx.post(
                f"{box.url}/v1/chat/completions", json=chat("tiny-llama"), timeout=60
            ),
            daemon=True,
        )
        caller.start()
        # the load, not a probe of the binary (its --port 0 start hangs too, for PROBE_S)
        until(lambda: loading(box), "the fake engine started")
        children = engine_pids(box)
        box.proc.send_signal(signal.SIGTERM)
        box.proc.wait(timeout=15)  # the bound the name promises; the stop ladder takes ~5 s
        assert not any(
            psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            for p in children
        )
    finally:
        stop_fitbox(box)


def test_a_prompt_that_outgrows_the_loaded_window_reloads_it_never_while_it_serves(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """A long prompt whose byte bound would hold more than a slot's share of the loaded
    engine's shared cells is counted by the engine first (FORMULAS.md §KV cells), then
    sent as it came; a count more than the slot places it again: it waits while the model
    serves (never sent to it), then reloads it when idle."""
    gate = tmp_path / "gate"
    gate.touch()  # open: the first call is not held
    env = {
        **gated_engine(llama_server_bin, gate),
        "FITBOX_CTX": "1024",
        "FITBOX_WAIT_TIMEOUT": "2",
        **HOLD_IDLE_TIMEOUT,
    }
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        assert (
            httpx.post(
                f"{box.url}/v1/chat/completions", json=chat(SMOL, max_tokens=2), timeout=60
            ).status_code
            == 200
        )
        first = resident(box, SMOL)
        assert first["window"] == 1024
        # ~700 tokens: its byte bound overflows the 1024-token slot, its tokens do not
        fits = {
            "model": SMOL,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello " * 700}],
        }
        served = httpx.post(f"{box.url}/v1/chat/completions", json=fits, timeout=60)
        assert served.status_code == 200, served.text
        assert 700 < served.json()["usage"]["prompt_tokens"] < 1024
        asked = [line for line in engine_logs(box).splitlines() if "fake: forwarded" in line]
        assert [a.rsplit(" ", 1)[-1] for a in asked[-3:]] == [
            "/apply-template",
            "/tokenize",
            "/v1/chat/completions",  # counted, then sent as it came
        ], asked
        sent = engine_logs(box).count("fake: forwarded POST /v1/chat/completions")
        # while a stream is on it, the model is never stopped: the big call waits, then
        # 503. The stream is held at the gate after its first event, however fast the
        # machine generates, until the test opens it
        big = {
            "model": SMOL,
            "messages": [{"role": "user", "content": "hello " * 1000}],
            "max_tokens": 2,
        }
        body = chat(SMOL, max_tokens=16, stream=True, ignore_eos=True)
        gate.unlink()
        try:
            streaming = Background(lambda: stream_lines(box, body))
            until(lambda: calls_on(box, SMOL) == 1, "the stream's call on the resident")
            serving = resident(box, SMOL)["pid"]
            busy = httpx.post(f"{box.url}/v1/chat/completions", json=big, timeout=60)
        finally:
            gate.touch()
        rest = streaming.result()
        assert busy.status_code == 503, busy.text
        assert busy.json()["error"]["code"] == "model_busy"
        assert rest[-1] == "data: [DONE]" and "error" not in "".join(rest[-3:])
        assert resident(box, SMOL)["pid"] == serving  # it served on, never reloaded
        # the stream went to the engine; the big call, counted first, never did
        assert engine_logs(box).count("fake: forwarded POST /v1/chat/completions") == sent + 1
        # idle now: the same call, streamed, reloads it with a window its prompt fits in
        again = stream_lines(box, {**big, "stream": True})
        assert again[-1] == "data: [DONE]" and "error" not in "".join(again), again
        second = resident(box, SMOL)
        assert second["window"] > 1024 and second["pid"] != serving
        assert "outgrows its 1024-token slot" in box.log()


def test_a_client_that_disconnects_mid_stream_cancels_the_generation_and_frees_the_slot(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    with running_fitbox(tmp_path / "home", [smollm2.parent]) as box:
        body = chat(SMOL, max_tokens=4000, stream=True, ignore_eos=True)
        with httpx.stream(
            "POST", f"{box.url}/v1/chat/completions", json=body, timeout=60
        ) as response:
            for n, _ in enumerate(response.iter_lines()):
                if n == 6:
                    break  # the client goes away mid-stream
        (resident,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
        engine = f"http://127.0.0.1:{resident['port']}"
        until(  # llama-server's own view of its slots; the row's tokens say it stopped early
            lambda: (
                not any(
                    slot["is_processing"]
                    for slot in httpx.get(f"{engine}/slots", timeout=SAFETY_S).json()
                )
            ),
            "the engine's slots idle once the client left",
        )
        row = box.calls()[-1]
        assert row["outcome"] == "interrupted"
        assert (row["completion_tokens"] or 0) < 4000
        assert httpx.get(f"{box.url}/v1/residents").json()["data"][0]["calls"] == 0


def test_a_pin_that_changes_the_rung_reloads_the_idle_model_and_never_doubles_it(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    env = {"FITBOX_SIMULATED_GPUS": "1GiB"}
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        assert (
            httpx.post(
                f"{box.url}/v1/chat/completions", json=chat(SMOL, max_tokens=2), timeout=60
            ).status_code
            == 200
        )
        (first,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
        assert first["rung"] == "gpu-only"
        pinned = httpx.post(
            f"{box.url}/v1/chat/completions", timeout=60, json=chat(f"{SMOL}@ram", max_tokens=2)
        )
        assert pinned.status_code == 200, pinned.text
        (second,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
        assert second["rung"] == "ram-only" and second["pid"] != first["pid"]
        assert len(engine_pids(box)) == 1  # the old child stopped; one child per file
        # an unpinned call is served by whatever rung is loaded
        assert (
            httpx.post(
                f"{box.url}/v1/chat/completions", json=chat(SMOL, max_tokens=2), timeout=60
            ).status_code
            == 200
        )
        (third,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
        assert third["pid"] == second["pid"]

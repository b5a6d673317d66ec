"""The fault run of bench/load.py: streaming clients over two real models in a RAM budget that
holds one, while faults are injected on a schedule set by progress (answered calls), not by
the clock:

1. every engine is killed (SIGKILL);
2. every engine is stopped (SIGSTOP) for three idle bounds, then continued (SIGCONT): the
   watchdog finds it hung and restarts it;
3. every engine is stopped for half an idle bound, then continued: a stall, not a hang;
4. fitbox itself is killed (SIGKILL) and started again on the same port and home.

Each call is one of: answered (200, the stream whole to ``[DONE]``), failed as data (an
OpenAI error body or error event), hung (no end within ``CALL_LIMIT_S``), cut (its first
byte came, then fitbox was killed), dropped (accepted, no byte, then fitbox was killed),
refused (no connection: fitbox was down), lost (anything else). Cut, dropped and refused
calls are tried again. Afterwards the store file is read: a call that got a first byte and has
no row is "without a row". Hung and without a row must be zero; answered calls stored as
anything but ``ok`` are reported too.

    .venv/bin/python bench/load.py --faults [--clients 16] [--calls 8] [--max-tokens 16]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.proxy_overhead import MODEL as SMOL
from bench.proxy_overhead import REPO
from fitbox.core import sizing
from fitbox.engines.child import free_port
from fitbox.models.gguf_facts import read_facts
from fitbox.models.pull import pull
from tests.support.ggufs import write_tiny_llama

IDLE_S = 2.0  # FITBOX_ENGINE_IDLE_TIMEOUT for the run
CALL_LIMIT_S = 180.0  # a call with no end by then is hung
FAULT_EVERY = 8  # answered calls between faults


@dataclass
class Run:
    url: str
    home: Path
    models: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    outcomes: dict[str, str] = field(default_factory=dict)  # request id -> outcome
    faults: list[str] = field(default_factory=list)
    progressed: asyncio.Event = field(default_factory=asyncio.Event)  # a call ended

    def answered(self) -> int:
        return sum(o == "answered" for o in self.outcomes.values())


def two_models(root: Path) -> tuple[list[str], int]:
    root.mkdir(parents=True, exist_ok=True)
    smol = pull("smollm2", REPO / ".cache" / "models")
    (root / smol.name).symlink_to(smol)
    write_tiny_llama(root / "tiny-a.gguf", extra_vocab=40_000)
    sizes = sorted(sizing.footprint(read_facts(p).shape, 4096, 1).total for p in root.iterdir())
    return [SMOL, "tiny-a"], sizes[-1] + sizes[0] // 2  # one at a time, never both


def serve(run: Run) -> None:
    port = run.url.rsplit(":", 1)[1]
    argv = [
        sys.executable,
        "-m",
        "fitbox",
        "serve",
        "--port",
        port,
        "--home",
        str(run.home),
        "--models",
        str(run.models),
    ]
    with (run.home / "serve.log").open("ab") as log:
        run.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **run.env}
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{run.url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.05)
    raise SystemExit("fitbox did not start")


def engines(run: Run) -> list[int]:
    assert run.proc is not None
    with contextlib.suppress(psutil.Error):
        return [p.pid for p in psutil.Process(run.proc.pid).children(recursive=True)]
    return []


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def one_call(
    client: httpx.AsyncClient, run: Run, model: str, request_id: str, max_tokens: int
) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    started = False  # the status line came: the response's first byte left fitbox
    try:
        async with client.stream(
            "POST",
            f"{run.url}/v1/chat/completions",
            json=body,
            headers={"x-request-id": request_id},
        ) as response:
            started = True
            if response.status_code != 200:
                error = json.loads(await response.aread()).get("error", {})
                return "failed" if error.get("code") and error.get("type") else "lost"
            events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    except (httpx.ConnectError, httpx.ConnectTimeout):
        return "refused"
    except httpx.TimeoutException:
        return "hung"
    except (httpx.HTTPError, ValueError):
        return "cut" if started else "dropped"
    if any(e.startswith('data: {"error"') for e in events):
        return "failed"
    return "answered" if events and events[-1] == "data: [DONE]" else "lost"


async def client_run(
    client: httpx.AsyncClient, run: Run, n: int, models: list[str], calls: int, max_tokens: int
) -> None:
    rng = random.Random(n)
    for k in range(calls):
        model, attempt = rng.choice(models), 0
        while True:
            request_id = f"c{n}-{k}-{attempt}"
            try:
                outcome = await asyncio.wait_for(
                    one_call(client, run, model, request_id, max_tokens), CALL_LIMIT_S
                )
            except TimeoutError:
                outcome = "hung"
            run.outcomes[request_id] = outcome
            run.progressed.set()
            if outcome not in ("refused", "dropped", "cut"):
                break
            attempt += 1  # fitbox was down: the client tries again once it is back
            await asyncio.sleep(0.2)


async def after(run: Run, answered: int) -> None:
    while run.answered() < answered:
        run.progressed.clear()
        await run.progressed.wait()


async def faults(run: Run) -> None:
    await after(run, FAULT_EVERY)
    signal_all(engines(run), signal.SIGKILL)
    run.faults.append("engines killed")
    for hold, name in (
        (3 * IDLE_S, "stopped past the idle bound"),
        (IDLE_S / 2, "stopped for half the idle bound"),
    ):
        await after(run, run.answered() + FAULT_EVERY)
        stopped = engines(run)
        signal_all(stopped, signal.SIGSTOP)
        await asyncio.sleep(hold)
        signal_all(stopped, signal.SIGCONT)
        run.faults.append(f"engines {name}, continued")
    await after(run, run.answered() + FAULT_EVERY)
    assert run.proc is not None
    run.proc.kill()
    await asyncio.to_thread(run.proc.wait)
    await asyncio.to_thread(serve, run)
    run.faults.append("fitbox killed and restarted")


async def drive(run: Run, models: list[str], clients: int, calls: int, max_tokens: int) -> None:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)
    timeout = httpx.Timeout(CALL_LIMIT_S, connect=5)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        injector = asyncio.ensure_future(faults(run))
        await asyncio.gather(
            *(client_run(client, run, n, models, calls, max_tokens) for n in range(clients))
        )
        injector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await injector


def rows(home: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(home / "fitbox.sqlite3")) as conn:
        return dict(conn.execute("SELECT request_id, outcome FROM call_log"))


def fault_run(clients: int, calls: int, max_tokens: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        names, budget = two_models(Path(tmp) / "models")
        home = Path(tmp) / "home"
        home.mkdir()
        # the run crashes engines on purpose: a crash limit it cannot reach keeps them loadable
        env = {
            "FITBOX_RAM_MAX": str(budget),
            "FITBOX_ENGINE_IDLE_TIMEOUT": str(IDLE_S),
            "FITBOX_STOP_GRACE": "1",
            "FITBOX_WAIT_TIMEOUT": "240",
            "FITBOX_CRASH_LIMIT": "100",
        }
        run = Run(f"http://127.0.0.1:{free_port()}", home, Path(tmp) / "models", env)
        print(
            f"{clients} streaming clients x {calls} calls over {len(names)} models, RAM "
            f"budget {budget >> 20} MiB (holds one), idle bound {IDLE_S:.0f} s"
        )
        serve(run)
        started = time.monotonic()
        try:
            asyncio.run(drive(run, names, clients, calls, max_tokens))
        finally:
            if run.proc is not None:
                run.proc.terminate()
                run.proc.wait(timeout=60)
        report(run, time.monotonic() - started)


def report(run: Run, wall: float) -> None:
    stored = rows(run.home)
    counts = Counter(run.outcomes.values())
    reached = [rid for rid, o in run.outcomes.items() if o not in ("refused", "dropped")]
    no_row = [rid for rid in reached if rid not in stored]
    not_ok = [rid for rid, o in run.outcomes.items() if o == "answered" and stored.get(rid) != "ok"]
    log = (run.home / "serve.log").read_text(errors="replace")
    print(f"faults: {'; '.join(run.faults) or 'none (too few calls)'}")
    print(
        f"calls: answered {counts['answered']}  failed as data {counts['failed']}  "
        f"hung {counts['hung']}  without a row {len(no_row)}  |  cut by the fitbox kill "
        f"{counts['cut']}  no byte before it {counts['dropped']}  refused while down "
        f"{counts['refused']}  lost {counts['lost']}  "
        f"answered but not stored ok {len(not_ok)}"
    )
    print(
        f"log: {log.count('hung: nothing for')} hang episodes, "
        f"{log.count('marked failed')} failed marks, "
        f"{log.count('never retrieved')} unread task exceptions; wall {wall:.1f} s"
    )
    if no_row or not_ok:
        print(
            f"  without a row: {no_row[:10]}  not stored ok: "
            f"{[(rid, stored.get(rid)) for rid in not_ok[:10]]}"
        )

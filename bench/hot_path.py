"""Where fitbox's added latency goes: one warm 1-token chat, stage by stage.

    python bench/hot_path.py [--calls 300] [--profile FILE.pstats] [--env NAME=VALUE]...

fitbox serves as a real process (``fitbox serve`` on the repo's SmolLM2), started through
this file so that each stage of the call path is timed inside it (``perf_counter_ns``
around the function that does the stage; nothing is added to fitbox itself). The client
sends 1-token chats alternately to the llama-server child directly and through fitbox (the
same child, so only the proxy differs) and prints, for each stage, its p50 and mean per
call in microseconds, and the client-side p50s and the added latency.

Stages (each a function of the path; ``app`` holds all but ``outside``):
  app        the whole ASGI application (the outermost middleware's call), per request
  auth       the key and trust check (``auth.admit`` + ``origin_of``)
  body       the body read, parsed and checked (``json_object`` + ``check_fields``)
  open       the call row queued (``CallDesk.open``)
  route      the name's checks (allowed, default model, served route: ``Serving._routed``)
             and ``thinking_for``
  prompt     the prompt's size for placement (``Needs.prompt``)
  place      joining the resident (``Call.place``: admission, the lease, its row values)
  send       to the child and back to its status line (``Call.send``): the engine's work
  read       the reply's body (``Call.read``)
  answered   usage and timings read, a measured speed recorded (``Call.answered``)
  reasoning  the whole reply reshaped: thinking split, asked name (``Reshape.whole``)
  finished   waiting for the row's commit (``Call.finished``)
  logpump    the child's log lines copied in fitbox's loop (``_LogPump._write``), per call
  commit     the store's writer committing a batch (``Writer._apply``, on its own thread):
             its events per call say how many commits a call costs, its wall what a
             ``finished`` may wait for
  outside    the client's added time not inside ``app``: uvicorn's HTTP parse and write,
             the event loop, the GIL (the store's writer thread), and the extra hop
``--profile`` also writes a cProfile of the server's timed phase (view with
``python -m pstats``). The box is shared: note ``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import signal
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proxy_overhead import REPO, child_url, percentile, start_fitbox_argv

MODEL = "SmolLM2-135M-Instruct.Q4_1"
STAGES = (
    "app",
    "auth",
    "body",
    "open",
    "route",
    "prompt",
    "place",
    "send",
    "read",
    "answered",
    "reasoning",
    "finished",
    "logpump",
    "commit",
    "sql",
)

# -- inside the server ---------------------------------------------------------------------

SPENT: dict[str, list[int]] = defaultdict(list)  # stage -> wall ns per event (server side)
CPU: dict[str, list[int]] = defaultdict(list)  # stage -> this thread's CPU ns per event


def _timed(stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            began, cpu = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return await fn(*args, **kwargs)
            finally:
                SPENT[stage].append(time.perf_counter_ns() - began)
                CPU[stage].append(time.thread_time_ns() - cpu)

        return timed_async

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        began, cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[stage].append(time.perf_counter_ns() - began)
            CPU[stage].append(time.thread_time_ns() - cpu)

    return timed


def _probe(owner: Any, name: str, stage: str) -> None:
    setattr(owner, name, _timed(stage, getattr(owner, name)))


def _install_probes() -> None:
    from fitbox.box import calls, serving
    from fitbox.box.needs import Needs
    from fitbox.engines import child
    from fitbox.server.door import auth, timing
    from fitbox.server.inference import openai
    from fitbox.server.streams import Reshape
    from fitbox.store import writer

    _probe(timing.ServerTimingMiddleware, "__call__", "app")
    _probe(auth, "admit", "auth")
    _probe(auth, "origin_of", "auth")
    _probe(openai, "json_object", "body")
    _probe(openai, "check_fields", "body")
    _probe(calls.CallDesk, "open", "open")
    _probe(serving.Serving, "_routed", "route")
    _probe(openai, "thinking_for", "route")
    _probe(Needs, "prompt", "prompt")
    _probe(calls.Call, "place", "place")
    _probe(calls.Call, "send", "send")
    _probe(calls.Call, "read", "read")
    _probe(calls.Call, "answered", "answered")
    _probe(Reshape, "whole", "reasoning")
    _probe(calls.Call, "finished", "finished")
    _probe(child._LogPump, "_write", "logpump")
    _probe(writer.Writer, "_apply", "commit")
    _probe(writer.Writer, "_transaction", "sql")


THREADS: dict[str, int] = {}  # thread name -> its CPU ns when the timed phase began


def _thread_cpu() -> dict[str, int]:
    """Each thread's CPU time so far (user + system), by its name."""
    import threading

    out: dict[str, int] = {}
    for thread in threading.enumerate():
        if thread.ident is not None:
            clock = time.pthread_getcpuclockid(thread.ident)
            out[thread.name] = out.get(thread.name, 0) + time.clock_gettime_ns(clock)
    return out


def serve_probed(argv: list[str]) -> int:
    """``fitbox serve`` with the probes in; SIGUSR1 clears what was timed (the warm-up),
    SIGUSR2 writes it (and the profile) to $HOT_PATH_OUT."""
    import cProfile

    from fitbox.cli import main

    _install_probes()
    profile = cProfile.Profile() if os.environ.get("HOT_PATH_PROFILE") else None

    def start(*_: object) -> None:
        SPENT.clear()
        CPU.clear()
        THREADS.update(_thread_cpu())
        if profile is not None:
            profile.enable()

    def dump(*_: object) -> None:
        if profile is not None:
            profile.disable()
            profile.dump_stats(os.environ["HOT_PATH_PROFILE"])
        threads = {name: ns - THREADS.get(name, 0) for name, ns in _thread_cpu().items()}
        Path(os.environ["HOT_PATH_OUT"]).write_text(
            json.dumps({"wall": SPENT, "cpu": CPU, "threads": threads})
        )

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, dump)
    return main(argv)


# -- the client ----------------------------------------------------------------------------


def chat(client: httpx.Client, base: str) -> float:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    started = time.perf_counter()
    response = client.post(f"{base}/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed


def _wait_for(path: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return dict(json.loads(path.read_text()))
        time.sleep(0.05)
    raise SystemExit("the probed fitbox wrote no timings")


def report(client_s: dict[str, list[float]], found: dict[str, Any], calls: int) -> None:
    spent, cpu, threads = found["wall"], found["cpu"], found["threads"]
    d50 = percentile(client_s["direct"], 50) * 1e6
    f50 = percentile(client_s["fitbox"], 50) * 1e6
    print(f"1-token chat, {calls} each, interleaved on the same child (client side)")
    print(
        f"  p50  direct {d50 / 1000:7.2f} ms   fitbox {f50 / 1000:7.2f} ms   "
        f"added {(f50 - d50) / 1000:+6.2f} ms   ratio {f50 / d50:.3f}"
    )
    print("stage         wall p50 us  wall/call us  cpu/call us  events/call")
    for stage in STAGES:
        values = spent.get(stage, [])
        if not values:
            print(f"  {stage:<10}            —")
            continue
        p50 = percentile([v / 1000 for v in values], 50)
        per_call = len(values) / calls
        print(
            f"  {stage:<10} {p50:12.1f}  {sum(values) / 1000 / calls:12.1f}  "
            f"{sum(cpu.get(stage, [])) / 1000 / calls:11.1f}  {per_call:11.2f}"
        )
    app, send = (percentile(spent.get(k, [0]), 50) / 1000 for k in ("app", "send"))
    print(
        f"  app minus send (p50s): {app - send:8.1f} us; outside it (added minus that): "
        f"{(f50 - d50) - (app - send):8.1f} us"
    )
    print("fitbox's CPU per call, by thread (all its work in the timed phase / calls):")
    for name, ns in sorted(threads.items(), key=lambda item: -item[1]):
        if ns > 0:
            print(f"  {name:<24} {ns / 1000 / calls:8.1f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--profile", type=Path, help="write a cProfile of the timed phase")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for fitbox")
    args = parser.parse_args()
    from fitbox.models.pull import pull

    model = pull("smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "spent.json"
        env = {
            **os.environ,
            "HOT_PATH_OUT": str(out),
            **dict(item.split("=", 1) for item in args.env),
        }
        if args.profile:
            env["HOT_PATH_PROFILE"] = str(args.profile.resolve())
        argv = [sys.executable, str(Path(__file__).resolve()), "--serve-probed"]
        proc, proxy = start_fitbox_argv(argv, Path(tmp) / "home", model.parent, env)
        client_s: dict[str, list[float]] = {"direct": [], "fitbox": []}
        try:
            limits = httpx.Limits(keepalive_expiry=2.0)
            with httpx.Client(timeout=120, limits=limits) as client:
                chat(client, proxy)  # loads the model
                direct = child_url(proc.pid)
                for _ in range(30):
                    chat(client, direct), chat(client, proxy)
                proc.send_signal(signal.SIGUSR1)
                time.sleep(0.2)
                for i in range(args.calls):
                    order = [("direct", direct), ("fitbox", proxy)]
                    for name, base in order if i % 2 else reversed(order):
                        client_s[name].append(chat(client, base))
                proc.send_signal(signal.SIGUSR2)
                spent = _wait_for(out)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    report(client_s, spent, args.calls)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-probed"]:
        raise SystemExit(serve_probed(sys.argv[2:]))
    raise SystemExit(main())

"""fitbox's own CPU per call and per streamed token: CPU the engine loses at concurrency.

    python bench/proxy_cpu.py [--tree NAME=SRC]... [--calls 100] [--streams 10]
                              [--tokens 128] [--rounds 3] [--idle 4]

Latency on a shared box is noise; CPU time is not: the fitbox process's CPU time (each of
its threads' ``/proc/PID/task/TID/schedstat``, in ns; not its children) is read before and
after each batch of calls. Each system is fitbox serving the repo's SmolLM2 as a real
process: one per ``--tree`` (a source tree's ``src/``, run through ``PYTHONPATH``; the first is the
baseline), then this checkout's own, all measured interleaved, round by round, in the
same run; each figure's ratio is against the first tree's.

Rows (medians over rounds; each figure has the idle rate measured in the same round taken
off, so the sensor loop's ticks during a batch are not counted as the calls'):
  idle      CPU ms per second with no calls (the sensor loop, the idle checks)
  call      CPU ms per 1-token chat call (non-streamed)
  stream    CPU ms per 1-token streamed chat call
  token     CPU µs per streamed token: (a --tokens stream - a 1-token stream) / (tokens - 1)
  first     wall ms of the longest ``/health`` answer while a fresh box places its first call
            (the event loop blocked: the engine probe, the load's own work)
The box is shared: note ``uptime`` beside the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rig import SMOL, Served, fitbox
from fitbox.models.pull import pull

CACHE = Path(os.environ.get("FITBOX_TEST_CACHE", Path(__file__).resolve().parents[1] / ".cache"))


def cpu_seconds(pid: int) -> float:
    """The process's CPU time to the nanosecond: each thread's ``schedstat`` (utime + stime
    count 10 ms ticks, too coarse to take an idle rate off a long batch)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0])
    if total:
        return total / 1e9
    times = psutil.Process(pid).cpu_times()  # no schedstat here (CONFIG_SCHEDSTATS off)
    return times.user + times.system


def chat(client: httpx.Client, url: str, tokens: int, stream: bool) -> bool:
    body = {
        "model": SMOL,
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    if not stream:
        client.post(f"{url}/v1/chat/completions", json=body, timeout=300).raise_for_status()
        return True
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for _ in r.iter_raw():
            pass
    return True


def measured(served: Served, idle_rate: float, work: Callable[[], object]) -> float:
    """CPU seconds fitbox spent on ``work``, less its idle rate over the same wall time."""
    began, wall = cpu_seconds(served.proc.pid), time.monotonic()
    work()
    spent = cpu_seconds(served.proc.pid) - began
    return spent - idle_rate * (time.monotonic() - wall)


def idle_rate(served: Served, seconds: float) -> float:
    began, wall = cpu_seconds(served.proc.pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(served.proc.pid) - began) / (time.monotonic() - wall)


def first_call_stall(served: Served) -> float:
    """The longest /health answer (ms) while the fresh box places and serves its first call."""
    longest, done = 0.0, threading.Event()

    def poll() -> None:
        nonlocal longest
        with httpx.Client() as probe:
            while not done.is_set():
                began = time.perf_counter()
                with contextlib.suppress(httpx.TransportError):
                    probe.get(f"{served.url}/health", timeout=30)
                longest = max(longest, time.perf_counter() - began)
                time.sleep(0.002)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        with httpx.Client() as client:
            chat(client, served.url, 1, False)
    finally:
        done.set()
        poller.join()
    return longest * 1000


@contextlib.contextmanager
def systems(home: Path, models: Path, trees: list[str]) -> Iterator[list[Served]]:
    """A fitbox per ``NAME=SRC`` tree, then this checkout's (``this``)."""
    mine = str(Path(__file__).resolve().parents[1] / "src")
    with contextlib.ExitStack() as stack:
        found = []
        for name, src in [tree.split("=", 1) for tree in trees] + [["this", mine]]:
            served = stack.enter_context(fitbox(home / name, models, PYTHONPATH=src))
            served.name = name
            found.append(served)
        yield found


ROWS = ("idle", "call", "stream", "token", "first")
UNITS = {
    "idle": "CPU ms/s",
    "call": "CPU ms",
    "stream": "CPU ms",
    "token": "CPU us",
    "first": "wall ms",
}


def one_round(served: Served, args: argparse.Namespace, seen: dict[str, list[float]]) -> None:
    rate = idle_rate(served, args.idle)
    seen["idle"].append(rate * 1000)
    with httpx.Client() as client:

        def calls(n: int, tokens: int, stream: bool) -> Callable[[], object]:
            return lambda: [chat(client, served.url, tokens, stream) for _ in range(n)]

        short = measured(served, rate, calls(args.calls, 1, False))
        seen["call"].append(short / args.calls * 1000)
        one = measured(served, rate, calls(args.streams, 1, True))
        seen["stream"].append(one / args.streams * 1000)
        long = measured(served, rate, calls(args.streams, args.tokens, True))
        seen["token"].append((long - one) / args.streams / (args.tokens - 1) * 1e6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        help="NAME=SRC: a source tree's src/ to run as a fitbox too",
    )
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=4.0, help="idle seconds per round")
    args = parser.parse_args()
    print(f"uptime before: {os.getloadavg()}", flush=True)
    smol = pull("smollm2", CACHE / "models")
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        models.mkdir()
        (models / smol.name).symlink_to(smol)
        with systems(Path(tmp), models, args.tree) as found:
            seen: dict[str, dict[str, list[float]]] = {
                s.name: {row: [] for row in ROWS} for s in found
            }
            for served in found:
                seen[served.name]["first"].append(first_call_stall(served))
            for i in range(args.rounds):
                for served in found[i % len(found) :] + found[: i % len(found)]:
                    one_round(served, args, seen[served.name])
                print(f"round {i + 1} done, load {os.getloadavg()}", flush=True)
    names = list(seen)
    print(f"{'row':8}{'unit':>10}" + "".join(f"{n:>18}" for n in names))
    for row in ROWS:
        medians = [statistics.median(seen[n][row]) for n in names]
        cells = [
            f"{m:>9.3f}" + (f" ({m / medians[0]:.2f}x)" if i and medians[0] > 0 else " " * 8)
            for i, m in enumerate(medians)
        ]
        print(f"{row:8}{UNITS[row]:>10}" + "".join(f"{c:>18}" for c in cells))
    print(f"uptime after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The store under a call load: cost per call-log row (insert + two updates, as a real call
makes), commits and fsyncs per call, how it changes with a big table, and how soon a
long-poller wakes after an event.

Baseline, same run: the same three statements on a plain sqlite3 connection in autocommit
(one commit each, what code without a writer thread would do).

    python bench/store.py [--rows 10000 1000000] [--calls 2000]

fsyncs are counted with strace (-f -c, fsync + fdatasync) on a child run of the same
workload; without strace they are reported as unknown.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fitbox.store.db import CallStart, Store  # noqa: E402


def fill(path: Path, rows: int) -> None:
    """Pre-fill the call log quickly (not what is measured)."""
    store = Store(path)
    store.close()
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO call_log (request_id, endpoint, model_asked, outcome, received_at,"
            " seq) VALUES (?, '/v1/chat/completions', 'm', 'ok', ?, ?)",
            ((f"r{i}", float(i), i) for i in range(rows)),
        )


def measure(path: Path, calls: int) -> tuple[float, float, int]:
    """(µs of caller time per call, µs until all is on disk per call, commits)."""
    store = Store(path)
    commits = [0]
    store.on_change(lambda counter: commits.__setitem__(0, commits[0] + 1))
    started = time.perf_counter()
    for i in range(calls):
        call = store.call_started(CallStart(f"b{i}", "/v1/completions", "m", False, 0.0))
        store.call_updated(call, admitted_at=1.0, device="host", window=4096)
        store.call_updated(
            call, outcome="ok", prompt_tokens=3, completion_tokens=5, last_byte_at=2.0
        )
    caller = time.perf_counter() - started
    store.flush()
    total = time.perf_counter() - started
    store.close()
    return caller / calls * 1e6, total / calls * 1e6, commits[0]


def baseline(path: Path, calls: int) -> float:
    """µs per call for the same three statements, autocommit, on the caller's thread."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    started = time.perf_counter()
    for i in range(calls):
        row = conn.execute(
            "INSERT INTO call_log (request_id, endpoint, model_asked, outcome, "
            "received_at) VALUES (?, '/v1/completions', 'm', 'pending', 0)",
            (f"d{i}",),
        ).lastrowid
        conn.execute(
            "UPDATE call_log SET admitted_at = 1, device = 'host', window = 4096 WHERE id = ?",
            (row,),
        )
        conn.execute(
            "UPDATE call_log SET outcome = 'ok', prompt_tokens = 3, "
            "completion_tokens = 5, last_byte_at = 2 WHERE id = ?",
            (row,),
        )
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed / calls * 1e6


def fsyncs_per_call(rows: int, calls: int) -> str:
    strace = shutil.which("strace")
    if strace is None:
        return "unknown (no strace)"
    out = subprocess.run(
        [
            strace,
            "-f",
            "-c",
            "-e",
            "trace=fsync,fdatasync",
            sys.executable,
            __file__,
            "--child",
            "--rows",
            str(rows),
            "--calls",
            str(calls),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    row = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?f(?:data)?sync$", re.M)
    counts = [int(m.group(1)) for m in row.finditer(out.stderr)]
    return f"{sum(counts) / calls:.3f}"


async def wake_latency(path: Path, events: int = 50) -> tuple[float, float]:
    """ms from submitting a call row to a long-poller (woken by the store's change listener
    through the loop, as server/manage/telemetry.py does) seeing the counter pass its cursor."""
    from fitbox.server.manage.telemetry import ChangeSignal

    store = Store(path)
    loop = asyncio.get_running_loop()
    signal = ChangeSignal()

    def wake(counter: int) -> None:
        loop.call_soon_threadsafe(signal.fire)

    store.on_change(wake)
    delays = []
    for i in range(events):
        since = store.counter
        started = time.perf_counter()
        store.call_started(CallStart(f"w{i}", "/v1/completions", "m", False, 0.0))
        while store.counter <= since:
            await signal.wait(5)
        delays.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.01)
    store.close()
    return statistics.median(delays), max(delays)


async def row_waits(path: Path, calls: int, hurry: bool) -> list[float]:
    """µs a response waits for its call's row when its first byte is ready the moment the
    call opens (the worst case: box/calls.py ``Call.written()``), with the writer hurried as
    fitbox does it, or left to its linger (the baseline: what waiting would cost without)."""
    store = Store(path)
    waits = []
    for i in range(calls):
        store.call_started(CallStart(f"r{i}", "/v1/completions", "m", True, 0.0))
        row = store.barrier()
        started = time.perf_counter()
        if not row.done():
            if hurry:
                store.hurry()
            await asyncio.wrap_future(row)
        waits.append((time.perf_counter() - started) * 1e6)
        store.call_updated(i + 1, admitted_at=1.0, device="host", window=4096)
    store.close()
    return sorted(waits)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # the workload alone, under strace
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.sqlite3"
            fill(path, args.rows[0])
            measure(path, args.calls)
        return 0
    print(f"{args.calls} calls (insert + 2 updates each, 3 events each), one writer thread")
    for rows in args.rows:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.sqlite3"
            fill(path, rows)
            caller_us, total_us, commits = measure(path, args.calls)
            direct_us = baseline(path, args.calls)
            print(
                f"  table of {rows:>9,} rows: caller {caller_us:6.1f} µs/call, "
                f"written {total_us:7.1f} µs/call, {commits} commits "
                f"({commits / args.calls:.3f} per call); baseline autocommit "
                f"{direct_us:7.1f} µs/call (ratio caller/baseline "
                f"{caller_us / direct_us:.3f})"
            )
    print(f"  fsyncs per call (10,000-row table): {fsyncs_per_call(10_000, args.calls)}")
    with tempfile.TemporaryDirectory() as tmp:
        median, worst = asyncio.run(wake_latency(Path(tmp) / "wake.sqlite3"))
    print(f"  long-poll wake after an event: median {median:.1f} ms, max {worst:.1f} ms")
    rounds = min(args.calls, 500)
    with tempfile.TemporaryDirectory() as tmp:
        hurried = asyncio.run(row_waits(Path(tmp) / "hurried.sqlite3", rounds, hurry=True))
        lingered = asyncio.run(row_waits(Path(tmp) / "lingered.sqlite3", 50, hurry=False))
    p50, p99 = hurried[len(hurried) // 2], hurried[int(len(hurried) * 0.99)]
    linger = lingered[len(lingered) // 2] / 1000
    print(
        f"  a row committed before the first byte (worst case: the byte is ready at once): "
        f"wait p50 {p50:.0f} µs, p99 {p99:.0f} µs over {rounds} calls; baseline, the same "
        f"wait on the linger alone: p50 {linger:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

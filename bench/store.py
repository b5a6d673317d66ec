"""The store under a call load: cost per call-log row (insert + two updates, as a real call
makes), commits per call, and how it changes with a big table.

    python bench/store.py [--rows 10000 200000]
"""

from __future__ import annotations

import argparse
import sqlite3
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
        store.call_updated(call, outcome="ok", prompt_tokens=3, completion_tokens=5,
                           last_byte_at=2.0)  # fmt: skip
    caller = time.perf_counter() - started
    store.flush()
    total = time.perf_counter() - started
    store.close()
    return caller / calls * 1e6, total / calls * 1e6, commits[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 200_000])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    print(f"{args.calls} calls (insert + 2 updates each, 3 events each), one writer thread")
    for rows in args.rows:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.sqlite3"
            fill(path, rows)
            caller_us, total_us, commits = measure(path, args.calls)
            print(f"  table of {rows:>9,} rows: caller {caller_us:6.1f} µs/call, "
                  f"written {total_us:7.1f} µs/call, {commits} commits "
                  f"({commits / args.calls:.3f} per call)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""fitbox's own CPU while it serves nothing: what it takes from an engine beside it.

    python bench/idle_cpu.py [--seconds 20] [SETTING=VALUE ...]

Starts fitbox (bench/rig.py) with the repo's SmolLM2, sends one chat so a model is loaded,
waits 3 s, then reads every thread of fitbox's process (its engine children not counted)
from ``/proc/PID/task/*/schedstat`` (nanoseconds on the CPU, kernel time included) over
``--seconds``, and prints each thread's and the total in ms of CPU a second. Extra
arguments are fitbox settings for the run, e.g. ``FITBOX_READING_INTERVAL=0.25``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rig import chat, fitbox, two_models

SETTLE_S = 3.0  # after the call: its row written, the engine idle


def on_cpu(pid: int) -> dict[int, int]:
    """Nanoseconds each thread of ``pid`` has run (a thread gone meanwhile is left out)."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("settings", nargs="*", help="SETTING=VALUE for fitbox")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.settings)
    with tempfile.TemporaryDirectory() as tmp:
        models, names, cap = two_models(Path(tmp) / "models")
        with fitbox(Path(tmp) / "home", models, FITBOX_RAM_MAX=str(cap), **env) as served:
            with httpx.Client(timeout=120) as client:
                chat(client, served.url, names[0])
            time.sleep(SETTLE_S)
            before = on_cpu(served.proc.pid)
            time.sleep(args.seconds)
            after = on_cpu(served.proc.pid)
    spent = {tid: (ns - before.get(tid, 0)) / 1e6 / args.seconds for tid, ns in after.items()}
    for tid, ms in sorted(spent.items(), key=lambda kv: -kv[1]):
        if ms >= 0.05:
            print(f"thread {tid}: {ms:.2f} ms/s")
    print(
        f"fitbox idle, every thread: {sum(spent.values()):.2f} ms of CPU a second "
        f"({' '.join(args.settings) or 'defaults'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Swap: where the time goes when fitbox swaps two models that cannot both stay.

One fitbox, a RAM cap that holds SmolLM2 or its Q4_0 but not both (bench/rig.py), calls
alternating between them: every call after the first evicts the other model and loads its
own. Each swap is cut into phases from fitbox's store (call_log, evictions, children: wall
clock) and the child's own log (llama-server's timestamps, from its log start):

  decide        call received -> eviction recorded (admission and the placement decision)
  victim stop   eviction recorded -> the victim's child reaped
  launch prep   victim reaped -> the new child launched (memory back, engine located, argv)
  spawn+seen    exec until llama-server's log starts, plus fitbox seeing it ready
  init          log start -> load_model (devices, CPU features, HTTP threads)
  metadata      load_model -> tensors (GGUF header read)
  mmap tensors  tensors -> context constructed (weights mapped)
  context       KV cache and compute buffers reserved
  warmup        llama-server's empty warmup run
  server init   slots, chat template -> listening
  first token   fitbox saw it ready -> the call's last byte

    python bench/swap.py [--rounds 10] [--warmup auto|on|off|on,auto]

Prints p50 and max per phase, and the whole swap as the client saw it.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rig import chat, fitbox, two_models

STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")
MARKS = (
    ("load", "load_model: loading model"),
    ("tensors", "load_tensors: loading model"),
    ("context", "llama_context: constructing"),
    ("warmup", "warming up the model"),
    ("slots", "load_model: initializing"),
    ("listening", "listening on"),
)
PHASES = (
    "decide",
    "victim stop",
    "launch prep",
    "spawn+seen",
    "init",
    "metadata",
    "mmap tensors",
    "context",
    "warmup",
    "server init",
    "first token",
)


def child_marks(log: Path) -> dict[str, float]:
    """Seconds from the child's log start to each mark, for the last launch in ``log``."""
    text = log.read_text(errors="replace")
    launch = text[text.rfind("\n$ ") + 1 :] if "\n$ " in text else text
    marks: dict[str, float] = {}
    for line in launch.splitlines():
        stamp = STAMP.match(line)
        if stamp is None:
            continue
        m, s, ms, us = (int(x) for x in stamp.groups())
        at = m * 60 + s + ms / 1e3 + us / 1e6
        for name, needle in MARKS:
            if name not in marks and needle in line:
                marks[name] = at
    return marks


def phases_of(home: Path) -> list[dict[str, float]]:
    """Per swap call (one that evicted), each phase in seconds."""
    conn = sqlite3.connect(home / "fitbox.sqlite3")
    calls = conn.execute(
        "SELECT id, received_at, load_start_at, load_ready_at, last_byte_at "
        "FROM call_log WHERE load_start_at IS NOT NULL AND evicted IS NOT NULL "
        "AND evicted != '[]' ORDER BY id"
    ).fetchall()
    found = []
    for call_id, received, launched, ready, last in calls:
        (evicted_at, victim) = conn.execute(
            "SELECT at, artifact FROM evictions WHERE call_id = ? ORDER BY id LIMIT 1", (call_id,)
        ).fetchone()
        (reaped,) = conn.execute(
            "SELECT MIN(ended_at) FROM children WHERE artifact = ? AND ended_at >= ?",
            (victim, evicted_at),
        ).fetchone()
        (port,) = conn.execute(
            "SELECT port FROM children WHERE started_at >= ? ORDER BY started_at LIMIT 1",
            (launched,),
        ).fetchone()
        (log,) = sorted((home / "logs").glob(f"*-{port}.log"))
        marks = child_marks(log)
        warm = marks.get("warmup", marks["slots"])
        found.append(
            {
                "decide": evicted_at - received,
                "victim stop": reaped - evicted_at,
                "launch prep": launched - reaped,
                "spawn+seen": (ready - launched) - marks["listening"],
                "init": marks["load"],
                "metadata": marks["tensors"] - marks["load"],
                "mmap tensors": marks["context"] - marks["tensors"],
                "context": warm - marks["context"],
                "warmup": marks["slots"] - warm,
                "server init": marks["listening"] - marks["slots"],
                "first token": last - ready,
            }
        )
    conn.close()
    return found


def report(label: str, rows: list[dict[str, float]], client: list[float]) -> None:
    print(f"  {label}: {len(rows)} swaps, ms")
    print(f"    {'phase':<14}{'p50':>9}{'max':>9}")
    for phase in PHASES:
        values = [r[phase] * 1000 for r in rows]
        print(f"    {phase:<14}{statistics.median(values):9.1f}{max(values):9.1f}")
    whole = [s * 1000 for s in client]
    print(f"    {'client total':<14}{statistics.median(whole):9.1f}{max(whole):9.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="swaps per fitbox")
    parser.add_argument(
        "--warmup",
        default="auto",
        help="FITBOX_WARMUP per fitbox, comma-separated: several run side by "
        "side, their swaps interleaved (e.g. on,auto)",
    )
    args = parser.parse_args()
    variants = args.warmup.split(",")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        models, names, cap = two_models(Path(tmp) / "models")
        client = stack.enter_context(httpx.Client())
        boxes = [
            stack.enter_context(
                fitbox(Path(tmp) / f"home-{v}", models, FITBOX_RAM_MAX=str(cap), FITBOX_WARMUP=v)
            )
            for v in variants
        ]
        seconds: dict[str, list[float]] = {v: [] for v in variants}
        for served in boxes:
            chat(client, served.url, names[0])  # the first load is not a swap
        for i in range(args.rounds):
            for variant, served in zip(variants, boxes, strict=True):
                took, status, body = chat(client, served.url, names[(i + 1) % 2])
                if status != 200:
                    raise SystemExit(f"swap call failed: {status} {body}")
                seconds[variant].append(took)
        time.sleep(0.5)  # the store's writer commits in groups: let the last one land
        stack.close()
        rows = {v: phases_of(Path(tmp) / f"home-{v}") for v in variants}
    print(f"swap between {names[0]} and {names[1]} (RAM cap {cap >> 20} MiB holds one)")
    for variant in variants:
        report(f"fitbox, FITBOX_WARMUP={variant}", rows[variant], seconds[variant])
    if len(variants) > 1:
        base = statistics.median(seconds[variants[0]])
        for variant in variants[1:]:
            ratio = statistics.median(seconds[variant]) / base
            print(f"  client total p50, {variant} / {variants[0]}: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

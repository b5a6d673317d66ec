"""Prompt read through fitbox against llama-server alone: #14's one figure that was short.

    python bench/prompt_read.py [--rounds 30] [--control]

side_by_side.py's prompt row with enough rounds to tell ~1 % apart: the repo's SmolLM2 in
direct llama-server (its defaults) and in fitbox, the same ~300-token prompt (cache off,
one token out) sent to each in turn, the order swapped every round, 0.2 s of quiet before
each call (side_by_side.interleaved). Its byte bound overflows fitbox's slot: the call
fitbox counted on its engine first until it sent such calls on their bound
(bench/prompt_count.py). Prints the engine's own prompt tokens/s
(``timings.prompt_per_second``) through each, fitbox's per-round ratio to direct's (the
geometric mean, a 95 % bootstrap interval), and the time of the whole call, fitbox − direct
per round, and the CPU fitbox's own process (every thread, its children not counted) used
over the rounds, per call of its own (idle work included). ``--control`` puts a second
direct llama-server, the same argv, where fitbox was: the ratio two identical engines give
on this box, the floor the fitbox row is read against.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rig import Served, chat, direct, fitbox, two_models
from bench.side_by_side import PROMPT, bootstrap_95, interleaved, spread

WARM_S = 8.0  # after the first calls: fitbox's idle engine is widened to the spare cores


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--control", action="store_true",
                        help="a second direct llama-server in fitbox's place")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models, names, cap = two_models(Path(tmp) / "models")
        model = names[0]
        other = (direct(models / f"{model}.gguf") if args.control
                 else fitbox(Path(tmp) / "home", models, FITBOX_RAM_MAX=str(cap)))  # fmt: skip
        with direct(models / f"{model}.gguf") as alone, other as box:
            box.name = "fitbox"  # the control too: the second system's row
            systems = [alone, box]
            own = psutil.Process(box.proc.pid)
            seconds: dict[str, list[float]] = {s.name: [] for s in systems}
            with httpx.Client(timeout=120) as client:

                def prompt_rate(served: Served) -> list[float]:
                    took, status, body = chat(client, served.url, model, content=PROMPT,
                                              cache_prompt=False)  # fmt: skip
                    timings = body.get("timings")
                    if status != 200 or not isinstance(timings, dict):
                        raise SystemExit(f"{served.name} answered {status}: {body}")
                    seconds[served.name].append(took)
                    return [float(timings["prompt_per_second"])]

                for served in systems:
                    chat(client, served.url, model)
                time.sleep(WARM_S)
                cpu_before = sum(own.cpu_times()[:2])
                rates = interleaved(systems, args.rounds, prompt_rate)
                cpu = sum(own.cpu_times()[:2]) - cpu_before
    for name, values in rates.items():
        print(f"{name:7} prompt {statistics.median(values):7.1f} tok/s (median of {len(values)})")
    print(f"fitbox ÷ direct: {spread(rates, 'fitbox')}")
    added = [(f - d) * 1000 for f, d in zip(seconds["fitbox"], seconds["direct"], strict=True)]
    low, high = bootstrap_95(added, statistics.median)
    print(f"{'control' if args.control else 'fitbox'} process CPU: "
          f"{cpu / args.rounds * 1000:.1f} ms a call, over {args.rounds * 2} calls to both")
    print(f"call time, fitbox − direct per round: {statistics.median(added):+.2f} ms "
          f"[95 % {low:+.2f} to {high:+.2f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

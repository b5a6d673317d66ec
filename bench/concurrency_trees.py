"""Concurrent clients through fitbox, per source tree, against direct llama-server, one run.

    python bench/concurrency_trees.py [--tree NAME=SRC]... [--rounds 6] [--clients 4]

Direct llama-server at its defaults (``-np`` its own) and a fitbox per ``--tree`` (a source
tree's ``src/`` through ``PYTHONPATH``; then this checkout's, ``this``) serve the repo's
SmolLM2. Each fitbox first serves two warm-up batches and idles ``--settle`` seconds (what
its thread policy does between batches is then done); then rounds of ``--clients``
simultaneous 64-token calls go to each system in turn (rotated), with a pause between
rounds. Prints the aggregate tokens/s (client side, bench/side_by_side.py ``concurrent``)
median per system, its ratio to direct, each round's figure, and each engine's ``-t``,
CPUs and threads before and after. The box is shared: note the load average printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rig import CACHE, SMOL, Served, direct, fitbox
from bench.side_by_side import concurrent, engines_of
from fitbox.models.pull import pull


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=SRC (repeatable)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--settle", type=float, default=8.0)
    parser.add_argument("--pause", type=float, default=4.0, help="seconds between rounds")
    args = parser.parse_args()
    smol = pull("smollm2", CACHE / "models")
    print(f"load average before: {os.getloadavg()}", flush=True)
    mine = str(Path(__file__).resolve().parents[1] / "src")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        models = Path(tmp) / "models"
        models.mkdir()
        (models / smol.name).symlink_to(smol)
        systems: dict[str, Served] = {"direct": stack.enter_context(direct(smol))}
        for name, src in [t.split("=", 1) for t in args.tree] + [["this", mine]]:
            systems[name] = stack.enter_context(fitbox(Path(tmp) / name, models, PYTHONPATH=src))
        for name, served in systems.items():
            if name != "direct":
                for _ in range(2):
                    concurrent(served, SMOL, args.clients)
        time.sleep(args.settle)
        print(f"engines: { {n: engines_of(s) for n, s in systems.items()} }", flush=True)
        seen: dict[str, list[float]] = {n: [] for n in systems}
        names = list(systems)
        for i in range(args.rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                seen[name].append(concurrent(systems[name], SMOL, args.clients))
            time.sleep(args.pause)
        base = statistics.median(seen["direct"])
        for name, rates in seen.items():
            print(
                f"{name:10} {statistics.median(rates):7.1f} tok/s "
                f"({statistics.median(rates) / base:.3f}x)  {[round(r) for r in rates]}"
            )
        print(f"engines after: { {n: engines_of(s) for n, s in systems.items()} }")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What an operator watching costs a call: the latency fitbox adds to a short completion with
nobody watching, and with the dashboard's event stream open and Prometheus-style scrapes of
/metrics running, in one run.

    python bench/operator_overhead.py [--blocks 20] [--per-block 20] [--scrape-every 1.0]

Calls alternate with direct calls to the same llama-server child (as bench/proxy_overhead.py
does), so "added" is fitbox minus direct for each pair. Blocks alternate watched and
unwatched, so drift in the machine lands on both. Every call moves the change counter, so
with the dashboard open each call makes the server render and send the page body once.
Prints the median added latency of each and their difference. Target: within 0.2 ms.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proxy_overhead import PROXY, REPO, child_url, short_call, start_fitbox
from fitbox.models.pull import pull

WATCHER = """
import sys, threading, httpx
proxy, every, what = sys.argv[1], float(sys.argv[2]), sys.argv[3]
def listen():
    with httpx.Client(timeout=None) as client, \
            client.stream("GET", proxy + "/dashboard/events") as events:
        for line in events.iter_lines():
            if line.startswith("event: update"):
                print("event", flush=True)
def scrape():
    stop = threading.Event()
    with httpx.Client(timeout=30) as client:
        while not stop.wait(every):
            client.get(proxy + "/metrics").raise_for_status()
            print("scrape", flush=True)
threads = [threading.Thread(target=f, daemon=True) for f in
           ([listen] if "events" in what else []) + ([scrape] if "metrics" in what else [])]
for t in threads: t.start()
sys.stdin.read()  # until the block ends
"""


@contextmanager
def watching(proxy: str, scrape_every: float, what: str) -> Iterator[dict[str, int]]:
    """The dashboard's event stream read and /metrics scraped, by a process of its own (its
    work never holds this process's interpreter while a call is timed)."""
    seen = {"events": 0, "scrapes": 0}
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, proxy, str(scrape_every), what],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield seen
    finally:
        out, _ = watcher.communicate("", timeout=30)
        seen["events"] = out.count("event")
        seen["scrapes"] = out.count("scrape")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--per-block", type=int, default=20)
    parser.add_argument("--scrape-every", type=float, default=1.0)
    parser.add_argument("--watch", default="events,metrics",
                        help="what watches: events (the dashboard), metrics, or both")
    args = parser.parse_args()
    model = pull("smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models")
    added: dict[str, list[float]] = {"unwatched": [], "watched": []}
    seen = {"events": 0, "scrapes": 0}
    with tempfile.TemporaryDirectory() as tmp:
        proc, proxy = start_fitbox(Path(tmp), model.parent)
        PROXY[0] = proxy
        try:
            with httpx.Client(timeout=120, limits=httpx.Limits(keepalive_expiry=2.0)) as client:
                short_call(client, proxy)  # loads the model
                direct = child_url(proc.pid)
                for _ in range(20):
                    short_call(client, direct)
                    short_call(client, proxy)
                for block in range(args.blocks):
                    kind = "watched" if block % 2 else "unwatched"
                    with (watching(proxy, args.scrape_every, args.watch) if kind == "watched"
                          else _nothing()) as counts:  # fmt: skip
                        for i in range(args.per_block):
                            if i % 2:
                                d, f = short_call(client, direct), short_call(client, proxy)
                            else:
                                f, d = short_call(client, proxy), short_call(client, direct)
                            added[kind].append(f - d)
                    for name in seen:
                        seen[name] += counts.get(name, 0)  # set once the block has ended
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    ms = 1000.0
    quiet = statistics.median(added["unwatched"]) * ms
    watched = statistics.median(added["watched"]) * ms
    print(f"short completions, {args.blocks} blocks of {args.per_block}, interleaved with direct")
    print(f"  added p50 unwatched {quiet:+6.3f} ms   watched {watched:+6.3f} ms   "
          f"difference {watched - quiet:+6.3f} ms   ratio {watched / quiet:.3f}"
          if quiet > 0 else f"  added p50 unwatched {quiet:+6.3f} ms   watched {watched:+6.3f} ms"
          )  # fmt: skip
    print(f"  while watched: {seen['events']} dashboard events, {seen['scrapes']} scrapes")
    return 0


@contextmanager
def _nothing() -> Iterator[dict[str, int]]:
    yield {}


if __name__ == "__main__":
    raise SystemExit(main())

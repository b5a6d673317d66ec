"""Issue 17's figure: the latency and the fitbox CPU a call costs with everything a client
and an operator can see turned on, against everything that can be off turned off, in one
run on one fitbox process.

    python bench/operator_overhead.py [--blocks 20] [--per-block 40] [--scrape-every 1.0]

"On": the dashboard's event stream open (its first update received before the block
starts), ``/metrics`` scraped every ``--scrape-every`` seconds, the box's reasoning split on
(``reasoning_field: reasoning_content``) and loading progress opted in (``progress``).
"Off": no watcher connected, ``reasoning_field: none``, ``progress: false``.
``Server-Timing`` has no switch: it is on in both, so its cost is in the "added" of both.

Each call through fitbox is paired with the same call straight to its llama-server child
(the order swapped each pair), so "added" is fitbox minus direct for each pair and the
engine's time cancels. Blocks alternate on and off, so drift in the machine lands on both.
Calls are short chats, whole (``max_tokens`` 1) and streamed (4 tokens), alternating.

Besides latency it prints the CPU time of the fitbox process (utime + stime of
/proc/PID/stat over each kind's blocks), which the other processes on a loaded box change
far less than they change latency: per call, and per second of wall time. Watching is work
per second (a scrape, at most one page update), not per call, so on a slow box its cost
per call looks larger than it is: the per-second row, and the last one (no calls at all,
off and then watched), say how much of it is that. The watcher is one process started
before any block (an earlier version started one per watched block, so its interpreter's
start-up landed in the very block it timed), told over stdin to connect and to leave.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proxy_overhead import MODEL, REPO, child_url, start_fitbox
from fitbox.models.pull import pull

WATCHER = """
import sys, threading, httpx
proxy, every = sys.argv[1], float(sys.argv[2])
on = None
def watch(stop):
    seen = threading.Event()
    def listen():
        try:
            with httpx.Client(timeout=None) as client, \\
                    client.stream("GET", proxy + "/dashboard/events") as events:
                for line in events.iter_lines():
                    if line.startswith("event: update"):
                        seen.set()
                        print("event", flush=True)
                    if stop.is_set():
                        return
        except httpx.HTTPError:
            pass
    listening = threading.Thread(target=listen, daemon=True)
    listening.start()
    seen.wait(60)
    with httpx.Client(timeout=30) as client:
        client.get(proxy + "/metrics").raise_for_status()
        print("scrape", flush=True)
        print("ready", flush=True)
        while not stop.wait(every):
            client.get(proxy + "/metrics").raise_for_status()
            print("scrape", flush=True)
    listening.join(60)
for command in sys.stdin:
    if command.strip() == "on":
        stop = threading.Event()
        on = threading.Thread(target=watch, args=(stop,), daemon=True)
        on.start()
    elif command.strip() == "off" and on is not None:
        stop.set()  # the stream ends at its next update: the bench makes one (a call)
        print("stopping", flush=True)
        on.join(60)
        print("idle", flush=True)
"""

ON = {"reasoning_field": "reasoning_content", "progress": True}
OFF = {"reasoning_field": "none", "progress": False}


class Watcher:
    """The dashboard open and /metrics scraped, by a process of its own: its work never holds
    this process's interpreter while a call is timed, and its CPU is not fitbox's."""

    def __init__(self, proxy: str, scrape_every: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WATCHER, proxy, str(scrape_every)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events = self.scrapes = 0

    def _until(self, word: str) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events += line.strip() == "event"
            self.scrapes += line.strip() == "scrape"
            if line.strip() == word:
                return
        raise SystemExit(f"the watcher ended before saying {word!r}")

    def tell(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def on(self) -> None:
        self.tell("on")
        self._until("ready")  # connected, first update and first scrape done

    def off(self, nudge: httpx.Client, proxy: str) -> None:
        self.tell("off")
        self._until("stopping")
        _chat(nudge, proxy, stream=False)  # an update, so the stream sees its stop
        self._until("idle")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


RESENT = [0]


def _chat(client: httpx.Client, base: str, stream: bool) -> float:
    try:
        return _chat_once(client, base, stream)
    except httpx.RemoteProtocolError:
        # llama-server drops some keep-alive connections after a stream without saying so
        # (bench/proxy_overhead.py resends the same way); fitbox resends once on its own
        RESENT[0] += 1
        return _chat_once(client, base, stream)


def _chat_once(client: httpx.Client, base: str, stream: bool) -> float:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4 if stream else 1,
        "temperature": 0,
        "stream": stream,
    }
    started = time.perf_counter()
    if stream:
        with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            for _ in response.iter_bytes():
                pass
    else:
        client.post(f"{base}/v1/chat/completions", json=body).raise_for_status()
    return time.perf_counter() - started


def _cpu_s(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _settings(client: httpx.Client, proxy: str, values: dict[str, object]) -> None:
    client.post(f"{proxy}/v1/settings/box", json=values).raise_for_status()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--per-block", type=int, default=40, help="pairs per block")
    parser.add_argument("--scrape-every", type=float, default=1.0)
    parser.add_argument(
        "--idle-s",
        type=float,
        default=5.0,
        help="seconds of no calls, off and then watched, at the end",
    )
    parser.add_argument(
        "--parts",
        default="watch,reasoning,progress",
        help="what 'on' turns on (to find which part costs): watch (the "
        "dashboard open and /metrics scraped), reasoning, progress",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    turned_on = {
        "reasoning_field": ON["reasoning_field"]
        if "reasoning" in parts
        else OFF["reasoning_field"],
        "progress": "progress" in parts,
    }
    model = pull("smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models")
    added: dict[str, dict[str, list[float]]] = {
        kind: {"whole": [], "stream": []} for kind in ("off", "on")
    }
    cpu = {"off": 0.0, "on": 0.0}
    wall = {"off": 0.0, "on": 0.0}
    calls = {"off": 0, "on": 0}
    idle: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        proc, proxy = start_fitbox(Path(tmp), model.parent)
        watcher = Watcher(proxy, args.scrape_every)
        try:
            with httpx.Client(timeout=120, limits=httpx.Limits(keepalive_expiry=2.0)) as client:
                _chat(client, proxy, stream=False)  # loads the model
                direct = child_url(proc.pid)
                for i in range(20):  # warm both paths
                    _chat(client, direct, stream=bool(i % 2))
                    _chat(client, proxy, stream=bool(i % 2))
                for block in range(args.blocks):
                    kind = "on" if block % 2 else "off"
                    _settings(client, proxy, turned_on if kind == "on" else OFF)
                    watched = kind == "on" and "watch" in parts
                    if watched:
                        watcher.on()
                    before, began = _cpu_s(proc.pid), time.monotonic()
                    for i in range(args.per_block):
                        stream = bool(i % 2)
                        shape = "stream" if stream else "whole"
                        if (i // 2) % 2:
                            d, f = _chat(client, direct, stream), _chat(client, proxy, stream)
                        else:
                            f, d = _chat(client, proxy, stream), _chat(client, direct, stream)
                        added[kind][shape].append(f - d)
                    cpu[kind] += _cpu_s(proc.pid) - before
                    wall[kind] += time.monotonic() - began
                    calls[kind] += args.per_block
                    if watched:
                        watcher.off(client, proxy)
                scrapes = watcher.scrapes
                for kind in ("off", "on"):  # no calls: what watching alone costs a second
                    if kind == "on":
                        watcher.on()
                    before = _cpu_s(proc.pid)
                    time.sleep(args.idle_s)
                    idle[kind] = (_cpu_s(proc.pid) - before) / args.idle_s
                watcher.off(client, proxy)  # reads the scrapes it made meanwhile
                idle_scrapes = watcher.scrapes - scrapes
        finally:
            watcher.close()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    ms = 1000.0
    print(
        f"short chats, {args.blocks} blocks of {args.per_block} pairs (fitbox, direct), "
        f"on ({args.parts}) and off blocks alternating; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    for shape in ("whole", "stream"):
        off = statistics.median(added["off"][shape]) * ms
        on = statistics.median(added["on"][shape]) * ms
        print(
            f"  {shape:6} added p50  off {off:+7.3f} ms   on {on:+7.3f} ms   "
            f"difference {on - off:+7.3f} ms"
        )
    per_call = {k: cpu[k] / calls[k] * ms for k in cpu}
    print(
        f"  fitbox CPU per call  off {per_call['off']:6.3f} ms   on {per_call['on']:6.3f} ms"
        f"   difference {per_call['on'] - per_call['off']:+6.3f} ms"
    )
    per_s = {k: cpu[k] / wall[k] * ms for k in cpu}
    print(
        f"  fitbox CPU per second  off {per_s['off']:6.1f} ms   on {per_s['on']:6.1f} ms   "
        f"difference {per_s['on'] - per_s['off']:+6.1f} ms   ({calls['on'] / wall['on']:.1f} "
        f"calls/s on, {scrapes / wall['on']:.2f} scrapes/s)"
    )
    print(
        f"  no calls: fitbox CPU per second  off {idle['off'] * ms:6.1f} ms   watched "
        f"{idle['on'] * ms:6.1f} ms ({idle_scrapes} scrapes in {args.idle_s:g} s)"
    )
    print(
        f"  while on: {watcher.events} dashboard updates, {scrapes} scrapes; "
        f"resends after a dropped keep-alive connection: {RESENT[0]}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

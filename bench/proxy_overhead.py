"""Proxy overhead: the same requests to llama-server directly and through fitbox, one run.

Both paths hit the *same* llama-server child (the one fitbox launched), interleaved, so the
engine, model, cache state and machine load are shared and only the proxy differs.

    python bench/proxy_overhead.py [--requests 200] [--streams 8] [--stream-tokens 256]
                                   [--concurrent 8] [--rounds 3]

Prints p50/p95 added latency for short non-streaming completions, time-to-first-byte added
for streams, and the streamed tokens/s ratio (fitbox / direct). Targets: < 2 ms added p50,
>= 98 % of direct streaming throughput. The concurrent row sends ``--concurrent`` streams
at once, to the child directly and through fitbox (the same child, so the same ``-np``),
in alternating rounds: aggregate tokens/s (all tokens / the round's wall time) and TTFB
p50/p99 over every stream of every round, with the fitbox / direct ratios.

The transformers rows (issue 16, ``--tf-requests 0`` leaves them out): SmolLM2 as a
float32 safetensors folder in the transformers child (the engine venv the tests build,
tests/support/tf_engine.py), the same child called directly and through fitbox, interleaved:
one-token chat calls (added p50 and the ratio) and streams (TTFB and tokens/s ratio).

Issue 17's figure (everything a client and an operator can see on, against all of it
off, in one run) is bench/operator_overhead.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import psutil

from fitbox.models.pull import pull

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
PROXY = [""]  # fitbox's URL once started
MODEL = "SmolLM2-135M-Instruct.Q4_1"


def start_fitbox(home: Path, models: Path) -> tuple[subprocess.Popen[bytes], str]:
    return start_fitbox_argv([sys.executable, "-m", "fitbox"], home, models, dict(os.environ))


def start_fitbox_argv(
    command: list[str], home: Path, models: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    """``command serve …`` (``python -m fitbox``, or a bench's own wrapper), healthy."""
    argv = [
        *command,
        "serve",
        "--port",
        "auto",
        "--home",
        str(home),
        "--models",
        str(models),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    endpoint = home / "endpoint.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"fitbox exited with {proc.returncode}")
        if endpoint.exists():
            url = str(json.loads(endpoint.read_text())["url"])
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("fitbox did not start")


def child_url(fitbox_pid: int) -> str:
    for child in psutil.Process(fitbox_pid).children(recursive=True):
        argv = child.cmdline()
        if "--port" in argv:
            return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    raise SystemExit("no llama-server child found")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


RETRIES = {"direct": 0, "fitbox": 0}


def short_call(client: httpx.Client, base: str) -> float:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    started = time.perf_counter()
    try:
        response = client.post(f"{base}/v1/completions", json=body)
    except httpx.RemoteProtocolError:
        # llama-server drops some keep-alive connections after a stream without saying
        # so; fitbox resends once in that case, and the direct path gets the same help
        RETRIES["direct" if base != PROXY[0] else "fitbox"] += 1
        started = time.perf_counter()
        response = client.post(f"{base}/v1/completions", json=body)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed


def stream_call(client: httpx.Client, base: str, tokens: int) -> tuple[float, float, int]:
    """(time to first byte, tokens/s between first and last byte, tokens)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    try:
        return _stream_once(client, base, body)
    except httpx.RemoteProtocolError:
        RETRIES["direct" if base != PROXY[0] else "fitbox"] += 1
        return _stream_once(client, base, body)


def _stream_once(
    client: httpx.Client, base: str, body: dict[str, object]
) -> tuple[float, float, int]:
    started = time.perf_counter()
    first = last = 0.0
    usage = 0
    with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            now = time.perf_counter()
            if not first:
                first = now
            last = now
            if line.startswith("data: {") and '"usage"' in line:
                usage = json.loads(line[6:])["usage"]["completion_tokens"]
    return first - started, usage / (last - first), usage


def concurrent_round(
    client: httpx.Client, base: str, streams: int, tokens: int
) -> tuple[float, list[float]]:
    """``streams`` streams started together: (aggregate tokens/s, each one's TTFB)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=streams) as pool:
        results = list(pool.map(lambda _: stream_call(client, base, tokens), range(streams)))
    wall = time.perf_counter() - started
    return sum(r[2] for r in results) / wall, [r[0] for r in results]


def interleaved(
    rounds: int, direct: str, proxy: str, measure: Callable[[str, str], T]
) -> dict[str, list[T]]:
    """``measure(name, base)`` on both paths, ``rounds`` each, the order swapped each round
    (so neither path always goes first, after the other has warmed the engine)."""
    got: dict[str, list[T]] = {"direct": [], "fitbox": []}
    for i in range(rounds):
        order = [("direct", direct), ("fitbox", proxy)]
        for name, base in order if i % 2 else reversed(order):
            got[name].append(measure(name, base))
    return got


def print_latency(lat: dict[str, list[float]]) -> None:
    for p in (50, 95):
        d, f = percentile(lat["direct"], p) * 1000.0, percentile(lat["fitbox"], p) * 1000.0
        print(
            f"  p{p}  direct {d:7.2f} ms   fitbox {f:7.2f} ms   added {f - d:+6.2f} ms "
            f"  ratio {f / d:.3f}"
        )


def tf_chat(client: httpx.Client, base: str, model: str) -> float:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "temperature": 0,
    }
    started = time.perf_counter()
    client.post(f"{base}/v1/chat/completions", json=body).raise_for_status()
    return time.perf_counter() - started


def tf_rows(requests: int, streams: int, tokens: int) -> None:
    """The transformers child directly and through fitbox, interleaved, one run."""
    sys.path.insert(0, str(REPO))
    from tests.support.tf_engine import smol_folder, tf_venv

    python = tf_venv()
    cache = Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache"))
    folder = smol_folder(python, pull("smollm2", cache / "models"))
    env = {"FITBOX_TF_PYTHON": str(python), "VIRTUAL_ENV": "", "CONDA_PREFIX": ""}
    os.environ.update(env)  # start_fitbox's child inherits it
    body = {
        "model": folder.name,
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "models").mkdir()
        (Path(tmp) / "models" / folder.name).symlink_to(folder)
        home = Path(tmp) / "home"
        home.mkdir()
        proc, proxy = start_fitbox(home, Path(tmp) / "models")
        try:
            with httpx.Client(timeout=600) as client:
                tf_chat(client, proxy, folder.name)  # loads the model
                direct = child_url(proc.pid)
                for _ in range(3):  # warm both paths
                    tf_chat(client, direct, folder.name)
                    tf_chat(client, proxy, folder.name)
                lat = interleaved(
                    requests, direct, proxy, lambda _, base: tf_chat(client, base, folder.name)
                )
                got = interleaved(
                    streams, direct, proxy, lambda _, base: _stream_once(client, base, body)
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    ms = 1000.0
    print(
        f"transformers child, SmolLM2-135M float32 on CPU: chat max_tokens=1 "
        f"({requests} each, interleaved)"
    )
    print_latency(lat)
    d_ttfb = statistics.median(s[0] for s in got["direct"]) * ms
    f_ttfb = statistics.median(s[0] for s in got["fitbox"]) * ms
    d_tps = statistics.median(s[1] for s in got["direct"])
    f_tps = statistics.median(s[1] for s in got["fitbox"])
    print(
        f"  streams ({streams} each, {tokens} tokens): TTFB median direct {d_ttfb:7.2f} ms "
        f"fitbox {f_ttfb:7.2f} ms (added {f_ttfb - d_ttfb:+6.2f} ms); tokens/s direct "
        f"{d_tps:6.1f} fitbox {f_tps:6.1f} ratio {f_tps / d_tps:.3f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-tokens", type=int, default=256)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tf-requests", type=int, default=30)
    parser.add_argument("--tf-streams", type=int, default=4)
    parser.add_argument("--tf-tokens", type=int, default=64)
    parser.add_argument("--only-tf", action="store_true", help="the transformers rows alone")
    args = parser.parse_args()
    if args.only_tf:
        tf_rows(args.tf_requests, args.tf_streams, args.tf_tokens)
        return 0

    model_path = pull(
        "smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models"
    )
    with tempfile.TemporaryDirectory() as tmp:
        proc, proxy = start_fitbox(Path(tmp), model_path.parent)
        PROXY[0] = proxy
        try:
            # under llama-server's own 5 s keep-alive; room for every concurrent stream
            limits = httpx.Limits(keepalive_expiry=2.0, max_connections=4 * args.concurrent)
            with httpx.Client(timeout=120, limits=limits) as client:
                short_call(client, proxy)  # loads the model
                direct = child_url(proc.pid)
                for _ in range(20):  # warm both paths
                    short_call(client, direct)
                    short_call(client, proxy)
                lat = interleaved(
                    args.requests, direct, proxy, lambda _, base: short_call(client, base)
                )

                def stream(name: str, base: str) -> tuple[float, float, int]:
                    try:
                        return stream_call(client, base, args.stream_tokens)
                    except httpx.HTTPError as exc:
                        raise SystemExit(f"a stream via {name} failed: {exc!r}") from exc

                streams = interleaved(args.streams, direct, proxy, stream)
                rounds = interleaved(
                    args.rounds,
                    direct,
                    proxy,
                    lambda _, base: concurrent_round(
                        client, base, args.concurrent, args.stream_tokens
                    ),
                )
                rates = {k: [rate for rate, _ in v] for k, v in rounds.items()}
                ttfbs = {k: [t for _, firsts in v for t in firsts] for k, v in rounds.items()}
                slots = json.loads(httpx.get(f"{direct}/props").text).get("total_slots")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)

    ms = 1000.0
    d_ttfb = statistics.median(s[0] for s in streams["direct"]) * ms
    f_ttfb = statistics.median(s[0] for s in streams["fitbox"]) * ms
    d_tps = statistics.median(s[1] for s in streams["direct"])
    f_tps = statistics.median(s[1] for s in streams["fitbox"])
    print(f"short completions ({args.requests} each, max_tokens=1, interleaved)")
    print_latency(lat)
    print(f"streams ({args.streams} each, {args.stream_tokens} tokens, ignore_eos)")
    print(
        f"  TTFB median  direct {d_ttfb:7.2f} ms   fitbox {f_ttfb:7.2f} ms   added "
        f"{f_ttfb - d_ttfb:+6.2f} ms"
    )
    print(
        f"  tokens/s     direct {d_tps:7.1f}      fitbox {f_tps:7.1f}      ratio "
        f"{f_tps / d_tps:.3f}"
    )
    print(
        f"concurrent streams ({args.concurrent} at once x {args.rounds} rounds each, "
        f"{args.stream_tokens} tokens, the child's slots: {slots})"
    )
    d_agg, f_agg = statistics.median(rates["direct"]), statistics.median(rates["fitbox"])
    print(
        f"  aggregate tokens/s  direct {d_agg:7.1f}   fitbox {f_agg:7.1f}   ratio "
        f"{f_agg / d_agg:.3f}"
    )
    for p in (50, 99):
        dp, fp = percentile(ttfbs["direct"], p) * ms, percentile(ttfbs["fitbox"], p) * ms
        print(f"  TTFB p{p}  direct {dp:8.1f} ms   fitbox {fp:8.1f} ms   ratio {fp / dp:.3f}")
    print(f"client resends after a dropped keep-alive connection: {RETRIES}")
    if args.tf_requests:
        tf_rows(args.tf_requests, args.tf_streams, args.tf_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The asked name in replies (server/streams/names.py, in the one pass, reshape.py): what
rewriting ``model`` costs, one run.

    python bench/name_rewrite.py [--events 20000] [--streams 8] [--stream-tokens 128]

1. In process: a chat stream's events (one event per engine write, as llama-server writes
   them) through the pass with only the rename (``Pass([], NameRewrite(...)).feed``) against
   the same pass with nothing to rename; the added time per event, and the ratio.
2. Through a real fitbox and its SmolLM2 child: the same streams asked by the file's own
   name (no rewrite) and by its alias ``smollm2`` (every chunk rewritten), interleaved;
   median TTFB and the largest gap between chunks, alias / name ratios.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.proxy_overhead import MODEL, REPO, start_fitbox
from fitbox.models.pull import pull
from fitbox.server.streams.names import NameRewrite
from fitbox.server.streams.reshape import Pass


def events(n: int) -> list[bytes]:
    chunk = {
        "choices": [{"finish_reason": None, "index": 0, "delta": {"content": " word"}}],
        "created": 1796136129,
        "id": "chatcmpl-DrGt4Io3qaKpTuJ6yPkm2PQGGHagn0x8",
        "model": MODEL,
        "system_fingerprint": "b0-unknown",
        "object": "chat.completion.chunk",
    }
    line = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    return [line] * n + [b"data: [DONE]\n\n"]


def in_process(n: int) -> tuple[float, float]:
    """Seconds per event: through the pass with no name to put back, and with one (best of
    5 runs each)."""
    stream = events(n)

    def plain() -> float:
        one = Pass([])
        started = time.perf_counter()
        out = [one.feed(piece) for piece in stream]
        assert out == stream
        return time.perf_counter() - started

    def rewritten() -> float:
        one = Pass([], NameRewrite(MODEL, "smollm2"))
        started = time.perf_counter()
        out = [one.feed(piece) for piece in stream]
        assert out[0].count(b'"model":"smollm2"') == 1
        return time.perf_counter() - started

    return min(plain() for _ in range(5)) / n, min(rewritten() for _ in range(5)) / n


def stream(client: httpx.Client, base: str, model: str, tokens: int) -> tuple[float, float]:
    """(time to first byte, largest gap between two chunks) of one streamed chat."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
    }
    started = time.perf_counter()
    arrivals: list[float] = []
    with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                assert json.loads(line[6:])["model"] == model
            arrivals.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return arrivals[0] - started, max(gaps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--stream-tokens", type=int, default=128)
    args = parser.parse_args()

    plain, rewritten = in_process(args.events)
    print(f"in process ({args.events} chat chunk events, best of 5)")
    print(
        f"  per event  passed on {plain * 1e6:6.3f} us   rewritten {rewritten * 1e6:6.3f} us"
        f"   added {(rewritten - plain) * 1e6:+6.3f} us"
    )

    model_path = pull(
        "smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models"
    )
    runs: dict[str, list[tuple[float, float]]] = {MODEL: [], "smollm2": []}
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_fitbox(Path(tmp), model_path.parent)
        try:
            with httpx.Client(timeout=120) as client:
                stream(client, url, MODEL, 4)  # loads the model, warms both paths
                stream(client, url, "smollm2", 4)
                for i in range(args.streams):
                    order = [MODEL, "smollm2"]
                    for name in order if i % 2 else reversed(order):
                        runs[name].append(stream(client, url, name, args.stream_tokens))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    ttfb = {k: statistics.median(r[0] for r in v) * 1e3 for k, v in runs.items()}
    gap = {k: statistics.median(r[1] for r in v) * 1e3 for k, v in runs.items()}
    print(f"through fitbox ({args.streams} streams each, {args.stream_tokens} tokens, interleaved)")
    print(
        f"  TTFB median         by name {ttfb[MODEL]:7.2f} ms   by alias "
        f"{ttfb['smollm2']:7.2f} ms   ratio {ttfb['smollm2'] / ttfb[MODEL]:.3f}"
    )
    print(
        f"  largest gap median  by name {gap[MODEL]:7.2f} ms   by alias "
        f"{gap['smollm2']:7.2f} ms   ratio {gap['smollm2'] / gap[MODEL]:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does counting a prompt on the engine just before the call slow the call's prompt read?

    python bench/prompt_count.py [--rounds 30]

fitbox counts a chat prompt on its engine (``/apply-template`` + ``/tokenize``, box/needs.py)
whenever the prompt's byte bound does not fit the slot of the loaded model: every ~300-token
prompt on a 512-token slot (``-c 2048 -np 4``). Three llama-servers on the repo's SmolLM2,
outside fitbox, read the same ~300-token prompt (cache off) in rotated order, 0.2 s apart:
``default`` (llama-server's defaults, ``-c 4096``), ``fitargv`` (the argv fitbox gives it)
and ``counted`` (the same argv, the prompt counted just before each call, as fitbox does).
Prints each against ``default``: the geometric mean of the per-round ratios of the engine's
own prompt tokens/s, with a 95 % bootstrap interval.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rig import SMOL, wait_health
from bench.side_by_side import PROMPT, bootstrap_95
from fitbox.engines.child import free_port
from fitbox.engines.llama_server import find_binary
from fitbox.models.pull import pull

FITBOX_ARGV = [
    "-c",
    "2048",
    "-np",
    "4",
    "-ngl",
    "0",
    "--kv-unified",
    "-t",
    "2",
    "--no-warmup",
    "--fit",
    "off",
    "--metrics",
    "--no-webui",
    "--reasoning-format",
    "deepseek",
    "--verbosity",
    "4",
    "--log-colors",
    "off",
]
VARIANTS = {"default": ["-c", "4096", "--no-webui"], "fitargv": FITBOX_ARGV, "counted": FITBOX_ARGV}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    cache = Path(__file__).resolve().parents[1] / ".cache" / "models"
    model = pull(SMOL, cache)
    binary = str(find_binary().path)
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for name, flags in VARIANTS.items():
            port = free_port()
            proc = subprocess.Popen(
                [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *flags],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            servers[name] = (proc, f"http://127.0.0.1:{port}")
            wait_health(servers[name][1], proc)
        body = {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 1,
            "cache_prompt": False,
        }
        rates: dict[str, list[float]] = {name: [] for name in servers}
        names = list(servers)
        with httpx.Client(timeout=120) as client:
            for i in range(args.rounds):
                for name in names[i % len(names) :] + names[: i % len(names)]:
                    url = servers[name][1]
                    time.sleep(0.2)
                    if name == "counted":
                        shown = client.post(f"{url}/apply-template", json=body).json()
                        client.post(
                            f"{url}/tokenize",
                            json={
                                "content": shown["prompt"],
                                "add_special": True,
                                "parse_special": True,
                            },
                        )
                    reply = client.post(f"{url}/v1/chat/completions", json=body).json()
                    rates[name].append(float(reply["timings"]["prompt_per_second"]))
    finally:
        for proc, _ in servers.values():
            proc.kill()
            proc.wait()
    for name in names[1:]:
        logs = [math.log(a / b) for a, b in zip(rates[name], rates["default"], strict=True)]
        low, high = (math.exp(x) for x in bootstrap_95(logs, statistics.fmean))
        print(
            f"{name:8} vs default: paired {math.exp(statistics.fmean(logs)):.3f}× "
            f"[95 % {low:.3f}-{high:.3f}], "
            f"prompt tok/s p50 {statistics.median(rates[name]):.1f} "
            f"(default {statistics.median(rates['default']):.1f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

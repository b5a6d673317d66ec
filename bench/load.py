"""Load: concurrent clients over three real models in a RAM budget that holds two.

For each admission policy (eta, smart, fifo) a fresh fitbox serves the same seeded call
sequence: ``--clients`` concurrent clients, each making ``--calls`` calls to a model drawn
from three (SmolLM2-135M and two generated llamas), on loopback. Reported per policy:
calls answered / failed as data (an OpenAI error body) / lost (no answer, or not an
OpenAI body), p50/p99 latency, and thrash: model loads per 100 calls (from the store's
``children`` rows, one per engine launched). The baseline in the same run is the ideal:
3 loads (each model once) for the same calls.

    .venv/bin/python bench/load.py [--clients 32] [--calls 3] [--max-tokens 8]

``--faults`` is the fault run instead (bench/load_faults.py): streaming clients over two
models in a RAM budget that holds one, while the engines are killed (SIGKILL), stopped and
continued (SIGSTOP/SIGCONT), and fitbox itself is killed and restarted.

    .venv/bin/python bench/load.py --faults [--clients 16] [--calls 8] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proxy_overhead import REPO, percentile, start_fitbox
from fitbox.core import sizing
from fitbox.models.gguf_facts import read_facts
from fitbox.models.pull import pull
from tests.support.ggufs import write_tiny_llama

SMOL = "SmolLM2-135M-Instruct.Q4_1"


def models_dir(root: Path) -> tuple[Path, list[str], int]:
    root.mkdir(parents=True, exist_ok=True)
    smol = pull("smollm2", REPO / ".cache" / "models")
    (root / smol.name).symlink_to(smol)
    write_tiny_llama(root / "tiny-a.gguf", extra_vocab=40_000)
    write_tiny_llama(root / "tiny-b.gguf", extra_vocab=60_000)
    sizes = sorted(sizing.footprint(read_facts(p).shape, 4096, 1).total for p in root.iterdir())
    budget = sizes[-1] + sizes[-2] + (sizes[0] // 2)  # two at once, never three
    return root, [SMOL, "tiny-a", "tiny-b"], budget


async def one_call(
    client: httpx.AsyncClient, url: str, model: str, max_tokens: int
) -> tuple[str, float]:
    started = time.monotonic()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": max_tokens,
    }
    try:
        response = await client.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    except httpx.HTTPError:
        return "lost", time.monotonic() - started
    took = time.monotonic() - started
    if response.status_code == 200:
        return "answered", took
    try:
        error = response.json()["error"]
        return ("failed" if error.get("code") and error.get("type") else "lost"), took
    except (ValueError, KeyError, TypeError):
        return "lost", took


async def drive(url: str, plan: list[list[str]], max_tokens: int) -> list[tuple[str, float]]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=len(plan))) as client:

        async def client_run(calls: list[str]) -> list[tuple[str, float]]:
            return [await one_call(client, url, model, max_tokens) for model in calls]

        results = await asyncio.gather(*(client_run(calls) for calls in plan))
    return [r for rs in results for r in rs]


def run_policy(
    policy: str, models: Path, budget: int, plan: list[list[str]], max_tokens: int
) -> dict[str, float]:
    import os

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        os.environ.update(
            {
                "FITBOX_ADMISSION": policy,
                "FITBOX_RAM_MAX": str(budget),
                "FITBOX_WAIT_TIMEOUT": "240",
            }
        )
        proc, url = start_fitbox(home, models)
        try:
            started = time.monotonic()
            results = asyncio.run(drive(url, plan, max_tokens))
            wall = time.monotonic() - started
            rows = httpx.get(
                f"{url}/v1/telemetry", params={"table": "children", "limit": 1000}, timeout=30
            ).json()["rows"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    latencies = [t for outcome, t in results if outcome == "answered"]
    calls = len(results)
    return {
        "answered": sum(o == "answered" for o, _ in results),
        "failed": sum(o == "failed" for o, _ in results),
        "lost": sum(o == "lost" for o, _ in results),
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p99": percentile(latencies, 99) if latencies else float("nan"),
        "loads_per_100": 100 * len(rows) / calls,
        "wall": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int)
    parser.add_argument("--calls", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--faults", action="store_true", help="the fault run instead")
    args = parser.parse_args()
    if args.faults:
        from bench.load_faults import fault_run

        fault_run(args.clients or 16, args.calls or 8, args.max_tokens or 16)
        return
    args.clients, args.calls = args.clients or 32, args.calls or 3
    args.max_tokens = args.max_tokens or 8
    with tempfile.TemporaryDirectory() as tmp:
        models, names, budget = models_dir(Path(tmp) / "models")
        rng = random.Random(7)
        plan = [[rng.choice(names) for _ in range(args.calls)] for _ in range(args.clients)]
        calls = args.clients * args.calls
        print(
            f"{args.clients} clients x {args.calls} calls over {len(names)} models, RAM "
            f"budget {budget >> 20} MiB (holds two); ideal: {100 * 3 / calls:.1f} loads/100 "
            "calls"
        )
        for policy in ("eta", "smart", "fifo"):
            r = run_policy(policy, models, budget, plan, args.max_tokens)
            print(
                f"{policy:>5}: answered {r['answered']:.0f}  failed {r['failed']:.0f}  "
                f"lost {r['lost']:.0f}  p50 {r['p50'] * 1000:7.0f} ms  "
                f"p99 {r['p99'] * 1000:7.0f} ms  loads/100 calls {r['loads_per_100']:5.1f} "
                f"(x{r['loads_per_100'] / (100 * 3 / calls):.1f} ideal)  "
                f"wall {r['wall']:.1f} s"
            )


if __name__ == "__main__":
    main()

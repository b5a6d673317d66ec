"""Which llama-server thread settings serve both a lone stream and a batch (issue 14).

    python bench/thread_policy.py [--rounds 4] [--clients 4] [--tokens 64] [--burn 30]
                                  [--variant NAME=ARGS]...

Each variant is a direct llama-server on the repo's SmolLM2 (window 4096, ``-np`` =
``--clients``, as a fitbox child would serve them), all started at once, measured
interleaved round by round (each round starts with the next variant: an engine's threads
still polling after its turn slow whichever comes right after it). Per variant and round:

  single    one client, ``--tokens`` tokens: the engine's own decode tokens/s
  prompt    one client, a ~300-token prompt read, cache off: the engine's prompt tokens/s
  batch     ``--clients`` clients at once: aggregate completion tokens/s, client side
  batch+cpu the same beside a Python process that burns ``--burn`` % of one core in short
            bursts (0.2 ms busy at a time): what fitbox's proxy takes relaying the batch

Every figure is printed as the median over rounds and as a ratio to ``default`` (the
variant with llama-server's own thread defaults) measured in the same rounds. The box is
shared: the load average is printed before and after; read the ratios, not the rates.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rig import SMOL, Served, chat, direct
from bench.side_by_side import PROMPT, concurrent
from fitbox.models.pull import pull

CACHE = Path(os.environ.get("FITBOX_TEST_CACHE", Path(__file__).resolve().parents[1] / ".cache"))
# llama-server's default -t is a thread per physical core (common.cpp cpu_get_num_math);
# -tb (default: -t) serves every graph of more than one token (llama-context.cpp
# graph_compute(..., ubatch.n_tokens > 1)): prompt reads, and decode steps of several
# slots at once. ggml_barrier spins whatever --poll says (ggml-cpu.c); --prio renices the
# whole engine (common.cpp set_process_priority: 2 is nice -10)
VARIANTS = {
    "default": "",
    "t1": "-t 1",
    "t2-poll0": "-t 2 --poll 0",
    "t2-tb1": "-t 2 -tb 1",
    "t1-tb2": "-t 1 -tb 2",
    "prio2": "--prio 2",
}
CASES = ("single", "prompt", "batch", "batch+cpu")
BURST_S = 0.0002  # one burst of the burner: the proxy's work per relayed piece is ~this


def burn(percent: float, stop: multiprocessing.synchronize.Event) -> None:
    """Busy ``percent`` % of one core, in bursts of ``BURST_S``, until ``stop``."""
    rest = BURST_S * (100 - percent) / max(percent, 1e-3)
    while not stop.is_set():
        until = time.perf_counter() + BURST_S
        while time.perf_counter() < until:
            pass
        time.sleep(rest)


@contextlib.contextmanager
def burning(percent: float) -> Iterator[None]:
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=burn, args=(percent, stop), daemon=True)
    proc.start()
    try:
        yield
    finally:
        stop.set()
        proc.join(5)


def engine_rate(served: Served, prompt: bool, tokens: int) -> float | None:
    with httpx.Client() as client:
        if prompt:
            _, status, body = chat(
                client, served.url, SMOL, max_tokens=1, content=PROMPT, cache_prompt=False
            )
        else:
            _, status, body = chat(client, served.url, SMOL, max_tokens=tokens, ignore_eos=True)
    found = body.get("timings") if status == 200 else None
    if not isinstance(found, dict):
        return None
    return float(found["prompt_per_second" if prompt else "predicted_per_second"])


def one_round(served: Served, args: argparse.Namespace, seen: dict[str, list[float]]) -> None:
    for case, rate in (
        ("single", engine_rate(served, False, args.tokens)),
        ("prompt", engine_rate(served, True, args.tokens)),
    ):
        if rate is not None:
            seen[case].append(rate)
    seen["batch"].append(concurrent(served, SMOL, args.clients, args.tokens))
    with burning(args.burn):
        seen["batch+cpu"].append(concurrent(served, SMOL, args.clients, args.tokens))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--burn", type=float, default=30.0, help="percent of one core")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=ARGS, more llama-server flags to compare (repeatable)",
    )
    parser.add_argument("--only", default="", help="comma-separated variant names to run")
    args = parser.parse_args()
    variants = dict(VARIANTS)
    for given in args.variant:
        name, _, flags = given.partition("=")
        variants[name] = flags
    if args.only:
        variants = {
            n: a for n, a in variants.items() if n in args.only.split(",") or n == "default"
        }
    print(f"load average before: {os.getloadavg()}", flush=True)
    smol = pull("smollm2", CACHE / "models")
    with tempfile.TemporaryDirectory(), contextlib.ExitStack() as stack:
        served = {}
        for name, extra in variants.items():
            served[name] = stack.enter_context(
                direct(smol, "-np", str(args.clients), *extra.split())
            )
        seen: dict[str, dict[str, list[float]]] = {n: {c: [] for c in CASES} for n in served}
        names = list(served)
        for n in names:  # warm: weights paged in, first-call costs paid
            engine_rate(served[n], False, 8)
        for i in range(args.rounds):
            for n in names[i % len(names) :] + names[: i % len(names)]:
                one_round(served[n], args, seen[n])
            print(f"round {i + 1}/{args.rounds}, load {os.getloadavg()}", flush=True)
    base = {c: statistics.median(seen["default"][c]) for c in CASES if seen["default"][c]}
    print(f"{'variant':12}{'flags':16}" + "".join(f"{c:>20}" for c in CASES))
    for n in names:
        cells = []
        for c in CASES:
            if not seen[n][c] or c not in base:
                cells.append(f"{'—':>20}")
                continue
            m = statistics.median(seen[n][c])
            cells.append(f"{m:>11.1f} ({m / base[c]:.3f}×)")
        print(f"{n:12}{variants[n] or '(defaults)':16}" + "".join(cells))
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

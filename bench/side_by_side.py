"""Side by side: llama-server directly, llama.cpp's router (``--models-max 1``) and fitbox, on
the same two models in one run, interleaved round by round (bench/rig.py).

    python bench/side_by_side.py [--latency 60] [--swaps 30] [--decode 6] [--prompt 6]
                                 [--clients 4] [--together 6] [--loads 10]
                                 [--tree NAME=SRC]... [--latency-only]

``--tree NAME=SRC`` adds a fitbox from another source tree (``fitbox@NAME``, run through
``PYTHONPATH``; say a worktree of an earlier commit) to the added-latency rounds, so two
commits are read against the same router in one run; ``--latency-only`` stops after them.

Figures, each with its ratio against the baseline measured in the same run:
  added latency   1-token chat, p50, on a loaded model (baseline: direct llama-server)
  swap            load the other model + 1 token, p50 / max (baseline: the router); the
                  RAM cap of fitbox holds one model, the router keeps one (--models-max 1)
  retries         calls that failed and were retried until they answered, over the swaps
  decode tok/s    256 tokens, one model alone, the engine's own timings (baseline: direct,
                  at its own default threads)
  prompt tok/s    a ~300-token prompt read, cache off, the engine's own timings
  concurrent      --clients clients at once on one model, aggregate tok/s, client side
                  (fitbox runs the -np its placement gives; direct runs its own default)
Decode, prompt and concurrent rounds are interleaved, each round led by the next system (so
each leads alike), with QUIET_S idle before every call; each ratio is of the medians; "paired"
is the geometric mean of the per-round ratios to direct's same round with its 95 % bootstrap
interval (an interval around 1 says the run cannot tell the two apart), "rounds" their
lowest and highest.
  load-to-ready   fitbox launch -> ready, minus llama-server's own readiness with the very
                  argv fitbox used (bench/load_to_ready.py), p50
Direct and the router run at their defaults but the window (4096); fitbox's RAM cap (one
model at a time) may give it a smaller one: the rows before the decode say what each ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.load_to_ready import fitbox_ready_and_direct
from bench.rig import Served, chat, direct, fitbox, percentile, router, two_models

PROMPT = " ".join(["the quick brown fox jumps over the lazy dog."] * 30)  # ~300 tokens
MAX_ATTEMPTS = 20


QUIET_S = 0.2  # before each timed engine call: llama.cpp's threads spin < 20 ms after one


def rotated(systems: list[Served], round_no: int) -> list[Served]:
    """Each round starts with the next system: an engine's threads still spinning after its
    call (llama.cpp polls for work a while) slow whichever is called right after it, and a
    round count that is a multiple of the systems' puts each first equally often."""
    shift = round_no % len(systems)
    return systems[shift:] + systems[:shift]


def balanced(rounds: int, systems: int = 3) -> int:
    """``rounds`` rounded up to a multiple of ``systems`` (each system first alike)."""
    return -(-rounds // systems) * systems


def bootstrap_95(
    values: list[float], statistic: Callable[[list[float]], float]
) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of ``statistic`` over 2000 resamples of ``values``
    (seeded, so the same data gives the same interval every run)."""
    draw = random.Random(14)
    found = sorted(statistic(draw.choices(values, k=len(values))) for _ in range(2000))
    return found[50], found[1949]


def interleaved(
    systems: list[Served], rounds: int, measure: Callable[[Served], list[float]]
) -> dict[str, list[float]]:
    """``measure`` of each system, round by round, each round led by the next system and
    every call after ``QUIET_S`` of quiet."""
    seen: dict[str, list[float]] = {s.name: [] for s in systems}
    for i in range(rounds):
        for served in rotated(systems, i):
            time.sleep(QUIET_S)
            seen[served.name] += measure(served)
    return seen


def spread(rates: dict[str, list[float]], name: str) -> str:
    """The per-round ratios to direct's same round: their geometric mean with a 95 %
    bootstrap interval (does the run tell the two apart?), lowest and highest."""
    ratios = [v / d for v, d in zip(rates[name], rates["direct"], strict=False) if d and v]
    if not ratios:
        return "no rounds"
    logs = [math.log(r) for r in ratios]
    low, high = (math.exp(x) for x in bootstrap_95(logs, statistics.fmean))
    return (
        f"paired {math.exp(statistics.fmean(logs)):.3f}× [95 % {low:.3f}-{high:.3f}], "
        f"rounds {min(ratios):.3f}-{max(ratios):.3f}"
    )


def added_latency(systems: list[Served], model: str, rounds: int) -> dict[str, dict[int, float]]:
    """Each system's 1-token call time, by round (a call a system dropped: no entry)."""
    seen: dict[str, dict[int, float]] = {s.name: {} for s in systems}
    with httpx.Client() as client:
        for served in systems:
            chat(client, served.url, model)  # loaded and its prompt cached, for every system
        for i in range(rounds):
            for served in rotated(systems, i):
                # quiet first: a rotation keeps who follows whom, so without it the system
                # after the router's (or another's) still-spinning engine paid for it
                time.sleep(QUIET_S)
                try:
                    took, status, _ = chat(client, served.url, model)
                except httpx.TransportError as exc:  # named, not fatal: whose connection broke
                    print(f"added latency, round {i}: {served.name} dropped the call ({exc!r})")
                    continue
                if status == 200:
                    seen[served.name][i] = took
    return seen


def added_ratio(by_round: dict[str, dict[int, float]], name: str) -> str:
    """``name``'s added latency (its p50 minus direct's) over the router's, from the same
    rounds: below 1, it adds less to a call than llama.cpp's own router does."""
    base = statistics.median(by_round["direct"].values())
    mine = statistics.median(by_round[name].values()) - base
    router_added = statistics.median(by_round["router"].values()) - base
    return f"{mine * 1000:+.2f} ms / {router_added * 1000:+.2f} ms = {mine / router_added:.2f}×"


def _tree(stack: contextlib.ExitStack, tmp: Path, models: Path, cap: int, tree: str) -> Served:
    """A fitbox from another source tree (``NAME=SRC``), as ``fitbox@NAME``."""
    name, src = tree.split("=", 1)
    served = stack.enter_context(
        fitbox(tmp / f"home-{name}", models, FITBOX_RAM_MAX=str(cap), PYTHONPATH=src)
    )
    served.name = f"fitbox@{name}"
    return served


def paired_difference(by_round: dict[str, dict[int, float]], a: str, b: str) -> str:
    """``a`` minus ``b`` in the rounds both answered: the median per-round difference with
    a 95 % bootstrap interval (an interval around 0 says the run cannot tell them apart)."""
    both = sorted(set(by_round[a]) & set(by_round[b]))
    diffs = [(by_round[a][i] - by_round[b][i]) * 1000 for i in both]
    if len(diffs) < 2:
        return "too few rounds"
    low, high = bootstrap_95(diffs, statistics.median)
    return (
        f"{a} − {b}, paired per round: {statistics.median(diffs):+.2f} ms "
        f"[95 % {low:+.2f} to {high:+.2f}] over {len(diffs)} rounds"
    )


def timings(served: Served, model: str, rounds: int, *, decode: bool) -> list[float]:
    """The engine's own tokens/s (decode, or prompt read) for each round."""
    rates = []
    with httpx.Client() as client:
        for _ in range(rounds):
            if decode:
                _, status, body = chat(client, served.url, model, max_tokens=256, ignore_eos=True)
            else:
                _, status, body = chat(
                    client, served.url, model, max_tokens=1, content=PROMPT, cache_prompt=False
                )
            found = body.get("timings") if status == 200 else None
            if isinstance(found, dict):
                key = "predicted_per_second" if decode else "prompt_per_second"
                rates.append(float(found[key]))
    return rates


def engines_of(served: Served) -> list[str]:
    """What each llama-server of ``served`` runs at now: its -t (or llama-server's default,
    a thread per physical core), its layers on a GPU, the CPUs it may use and its threads,
    read from /proc."""
    found = []
    top = psutil.Process(served.proc.pid)
    for proc in [top, *top.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            argv = proc.cmdline()
            if not argv or not argv[0].endswith("llama-server") or "--models-dir" in argv:
                continue
            t, c, np, ngl = (
                argv[argv.index(f) + 1] if f in argv[:-1] else "default"
                for f in ("-t", "-c", "-np", "-ngl")
            )
            found.append(
                f"-t {t} -c {c} -np {np} -ngl {ngl} on CPUs "
                f"{sorted(proc.cpu_affinity() or [])}, {proc.num_threads()} "
                "threads"
            )
    return found


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def concurrent(served: Served, model: str, clients: int, tokens: int = 64) -> float:
    """Aggregate completion tokens/s of ``clients`` simultaneous calls (client side)."""
    done: list[int] = []
    start = threading.Barrier(clients + 1)

    def one() -> None:
        with httpx.Client() as client:
            start.wait()
            _, status, body = chat(client, served.url, model, max_tokens=tokens, ignore_eos=True)
            usage = body.get("usage") if status == 200 else None
            done.append(int(usage["completion_tokens"]) if isinstance(usage, dict) else 0)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - began)


def swaps(
    systems: list[Served], names: list[str], rounds: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Alternate the two models on each system; a failed call is retried (and counted)
    until it answers. A swap's time runs from its first attempt to its answer."""
    seconds: dict[str, list[float]] = {s.name: [] for s in systems}
    retries = dict.fromkeys(seconds, 0)
    with httpx.Client() as client:
        for served in systems:
            chat(client, served.url, names[0])
        for i in range(rounds):
            for served in rotated(systems, i // 2):  # each model's swap, in turn, first
                began = time.perf_counter()
                for _ in range(MAX_ATTEMPTS):
                    with contextlib.suppress(httpx.TransportError):
                        if chat(client, served.url, names[(i + 1) % 2])[1] == 200:
                            break
                    retries[served.name] += 1
                seconds[served.name].append(time.perf_counter() - began)
    return seconds, retries


def row(label: str, values: dict[str, str]) -> None:
    print(
        f"| {label} | {values.get('direct', '—')} | {values.get('router', '—')} | "
        f"{values.get('fitbox', '—')} |",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=int, default=60, help="1-token chat rounds")
    parser.add_argument("--swaps", type=int, default=30, help="swap rounds")
    parser.add_argument(
        "--decode", type=int, default=6, help="256-token rounds (rounded up to a multiple of 3)"
    )
    parser.add_argument(
        "--prompt", type=int, default=6, help="prompt-read rounds (rounded up to a multiple of 3)"
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--together", type=int, default=6, help="concurrent rounds (rounded up to a multiple of 3)"
    )
    parser.add_argument("--loads", type=int, default=10, help="load-to-ready rounds")
    parser.add_argument(
        "--settle",
        type=float,
        default=8.0,
        help="seconds idle before the decode rows: fitbox widens an engine "
        "loaded beside other work (here: the router's swaps) once the box "
        "stayed quiet 2 s and its cores free 3 checks in a row",
    )
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC")
    parser.add_argument("--latency-only", action="store_true")
    args = parser.parse_args()
    ms: Callable[[float], str] = lambda s: f"{s * 1000:.1f} ms"  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        models, names, cap = two_models(Path(tmp) / "models")
        model_a = models / f"{names[0]}.gguf"
        systems = [
            stack.enter_context(direct(model_a)),
            stack.enter_context(router(models)),
            stack.enter_context(fitbox(Path(tmp) / "home", models, FITBOX_RAM_MAX=str(cap))),
        ]
        by = {s.name: s for s in systems}
        others = [_tree(stack, Path(tmp), models, cap, tree) for tree in args.tree]
        print(
            f"side by side: {names[0]} and {names[1]}, window 4096, fitbox RAM cap "
            f"{cap >> 20} MiB (one model at a time)"
        )
        print("| figure | direct llama-server | llama.cpp router (--models-max 1) | fitbox |")
        print("|---|---|---|---|", flush=True)

        by_round = added_latency(systems + others, names[0], args.latency)
        latency = {n: list(v.values()) for n, v in by_round.items()}
        base = statistics.median(latency["direct"])
        row(
            f"added latency of a 1-token chat, p50 ({args.latency} rounds)",
            {
                n: (
                    f"{ms(base)} (baseline)"
                    if n == "direct"
                    else f"{(statistics.median(v) - base) * 1000:+.2f} ms "
                    f"({statistics.median(v) / base:.3f}×)"
                )
                for n, v in latency.items()
                if v
            },
        )
        print(f"added latency: {paired_difference(by_round, 'fitbox', 'router')}", flush=True)
        for name in ["fitbox", *(served.name for served in others)]:
            print(f"added latency: {name} ÷ router: {added_ratio(by_round, name)}", flush=True)
        if args.latency_only:
            return 0

        swapped, retries = swaps([by["router"], by["fitbox"]], names, args.swaps)
        r50 = statistics.median(swapped["router"])
        row(
            f"swap (load + 1 token), p50 / max ({args.swaps} rounds)",
            {
                n: f"{ms(statistics.median(v))} / {ms(max(v))} "
                f"({statistics.median(v) / r50:.2f}× the router's p50; max "
                f"{max(v) / statistics.median(v):.2f}× its own p50)"
                for n, v in swapped.items()
            },
        )
        row(
            f"calls that failed and needed a retry, {args.swaps} rounds",
            {n: str(v) for n, v in retries.items()},
        )

        running = {s.name: engines_of(s) for s in systems}
        time.sleep(args.settle)  # every system idle alike; the swaps were other work
        print(
            f"before the decode rows (load average {load_average()}): after the swaps "
            f"{running}; after {args.settle:.0f} s idle "
            f"{ {s.name: engines_of(s) for s in systems} }",
            flush=True,
        )
        decode_rounds, prompt_rounds = balanced(args.decode), balanced(args.prompt)
        # interleaved: the machine's load is shared
        decode = interleaved(systems, decode_rounds, lambda s: timings(s, names[0], 1, decode=True))
        prompt = interleaved(
            systems, prompt_rounds, lambda s: timings(s, names[0], 1, decode=False)
        )
        for label, rates in (
            (f"decode tok/s, 256 tokens, one model alone ({decode_rounds} rounds)", decode),
            (f"prompt-read tok/s, ~300 tokens ({prompt_rounds} rounds)", prompt),
        ):
            d = statistics.median(rates["direct"]) if rates["direct"] else float("nan")
            row(
                label,
                {
                    n: f"{statistics.median(v):.1f} ({statistics.median(v) / d:.3f}×"
                    f"{'' if n == 'direct' else '; ' + spread(rates, n)})"
                    for n, v in rates.items()
                    if v
                },
            )

        print(
            f"after the decode and prompt rows (load average {load_average()}): "
            f"{ {s.name: engines_of(s) for s in systems} }",
            flush=True,
        )
        together_rounds = balanced(args.together)
        together = interleaved(
            systems, together_rounds, lambda s: [concurrent(s, names[0], args.clients)]
        )
        d = statistics.median(together["direct"])
        row(
            f"concurrent aggregate tok/s, {args.clients} clients × 64 tokens "
            f"({together_rounds} rounds)",
            {
                n: f"{statistics.median(v):.1f} ({statistics.median(v) / d:.3f}×"
                f"{'' if n == 'direct' else '; ' + spread(together, n)})"
                for n, v in together.items()
            },
        )
        stack.close()

        fit, own = fitbox_ready_and_direct(models.parent / "load", model_a, args.loads)
        added = [f - d for f, d in zip(fit, own, strict=True)]
        row(
            f"load-to-ready, p50 ({args.loads} rounds; fitbox: minus direct with its argv)",
            {
                "direct": ms(statistics.median(own)),
                "fitbox": f"{ms(statistics.median(fit))}, added "
                f"{statistics.median(added) * 1000:+.1f} ms "
                f"({statistics.median(fit) / statistics.median(own):.3f}×)",
            },
        )
    raw = {
        "swap_ms": {n: [round(x * 1000) for x in v] for n, v in swapped.items()},
        "latency_p95_ms": {
            n: round(percentile(v, 0.95) * 1000, 2) for n, v in latency.items() if v
        },
        "load_added_ms": [round(x * 1000, 1) for x in added],
    }
    print(f"raw: {json.dumps(raw)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

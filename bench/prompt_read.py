"""Prompt read through fitbox against llama-server alone: #14's one figure that was short.

    python bench/prompt_read.py [--sessions 12] [--rounds 6] [--control-flags '...']

side_by_side.py's prompt row with enough sessions to tell ~1 % apart: the repo's SmolLM2 in
direct llama-server (its defaults), in a second direct llama-server, the same argv (the
control), and in fitbox, all at one window (fitbox runs without a RAM cap here, and the
bench checks its engine holds direct's window). The same ~300-token prompt (cache off, one
token out) goes to each in turn, each round led by the next system, 0.2 s of quiet before
each call (side_by_side.interleaved). Prints the engine's own prompt tokens/s
(``timings.prompt_per_second``), fitbox's and the control's ratio to direct's same round,
and fitbox's to the control's; the time of the whole call, fitbox − direct; and the CPU
fitbox's own process (every thread, its children not counted) used over the rounds, per
call of its own (idle work included). The control row is what two identical engines give
on this box: the floor the fitbox row is read against.

Each session starts every system afresh, because a llama-server process reads at a speed
of its own. The same two processes read within ±0.5 % of each other round after round; a
fresh pair lands elsewhere, by ±3 % on this 2-core box (a session's ratio ranged 0.93-1.06
between two launches of one argv; where each process's memory and stack fell). A run of
one session measures that luck as much as fitbox, so the figure is the geometric mean over
many short sessions, its interval a bootstrap over sessions; and the median of every
round's ratio, which a few rounds disturbed by other work on the box do not move.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rig import WINDOW, Served, chat, direct, fitbox, two_models
from bench.side_by_side import PROMPT, bootstrap_95, interleaved

WARM_S = 8.0  # after the first calls: fitbox's idle engine is widened to the spare cores
SYSTEMS = ("direct", "fitbox", "control")
# each row: one system's rate over another's in the same round
PAIRS = {
    "fitbox ÷ direct": ("fitbox", "direct"),
    "control ÷ direct": ("control", "direct"),
    "fitbox ÷ control": ("fitbox", "control"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12, help="fresh sets of systems")
    parser.add_argument(
        "--rounds", type=int, default=6, help="rounds a session (a multiple of 3 leads each alike)"
    )
    parser.add_argument(
        "--control-flags",
        default="",
        help="flags the control's llama-server adds to direct's argv, "
        "e.g. the ones fitbox launches with",
    )
    args = parser.parse_args()
    sessions: dict[str, list[float]] = {row: [] for row in PAIRS}  # each session's geo-mean
    rounds: dict[str, list[float]] = {row: [] for row in PAIRS}  # every round's ratio
    for n in range(args.sessions):
        rates, added, cpu = session(args.rounds, args.control_flags.split(), first=n)
        for row, (a, b) in PAIRS.items():
            logs = [math.log(x / y) for x, y in zip(rates[a], rates[b], strict=True)]
            sessions[row].append(math.exp(statistics.fmean(logs)))
            rounds[row] += [math.exp(x) for x in logs]
        print(
            f"session {n + 1}: direct {statistics.median(rates['direct']):6.1f} tok/s; "
            f"÷ direct: fitbox {sessions['fitbox ÷ direct'][-1]:.3f}, control "
            f"{sessions['control ÷ direct'][-1]:.3f}; call time fitbox − direct "
            f"{statistics.median(added):+.2f} ms; fitbox process CPU "
            f"{cpu / args.rounds * 1000:.1f} ms a call",
            flush=True,
        )
    for row, ratios in sessions.items():
        logs = [math.log(r) for r in ratios]
        low, high = (math.exp(x) for x in bootstrap_95(logs, statistics.fmean))
        # a round another tenant of the box disturbed moves a mean; the median of every
        # round does not move for a few of them
        m_low, m_high = bootstrap_95(rounds[row], statistics.median)
        print(
            f"{row:17} over {args.sessions} sessions of {args.rounds} rounds: "
            f"{math.exp(statistics.fmean(logs)):.3f}× [95 % over sessions {low:.3f}-"
            f"{high:.3f}], sessions {min(ratios):.3f}-{max(ratios):.3f}; median of all "
            f"rounds {statistics.median(rounds[row]):.3f}× "
            f"[{m_low:.3f}-{m_high:.3f}]"
        )
    return 0


def session(
    rounds: int, flags: list[str], first: int
) -> tuple[dict[str, list[float]], list[float], float]:
    """One fresh set of systems: each one's prompt rates by round, the call time fitbox −
    direct per round (ms), and the CPU fitbox's own process used over the rounds (s).
    Session ``first`` starts them in an order rotated by one from the last (the control
    read 0.992× when direct was always started first)."""
    with tempfile.TemporaryDirectory() as tmp:
        models, names, _ = two_models(Path(tmp) / "models")
        model = names[0]
        gguf = models / f"{model}.gguf"
        # no RAM cap (only one model is called): fitbox loads the window direct runs,
        # checked below, where side_by_side's cap shrinks it to 2048
        starts = {
            "direct": lambda: direct(gguf),
            "control": lambda: direct(gguf, *flags),
            "fitbox": lambda: fitbox(Path(tmp) / "home", models),
        }
        shift = first % len(SYSTEMS)
        with contextlib.ExitStack() as stack:
            up: dict[str, Served] = {}
            for name in SYSTEMS[shift:] + SYSTEMS[:shift]:
                up[name] = stack.enter_context(starts[name]())
                up[name].name = name
            systems = [up[name] for name in SYSTEMS]
            own = psutil.Process(up["fitbox"].proc.pid)
            seconds: dict[str, list[float]] = {s.name: [] for s in systems}
            with httpx.Client(timeout=120) as client:

                def prompt_rate(served: Served) -> list[float]:
                    took, status, body = chat(
                        client, served.url, model, content=PROMPT, cache_prompt=False
                    )
                    timings = body.get("timings")
                    if status != 200 or not isinstance(timings, dict):
                        raise SystemExit(f"{served.name} answered {status}: {body}")
                    seconds[served.name].append(took)
                    return [float(timings["prompt_per_second"])]

                for served in systems:
                    chat(client, served.url, model)
                same_window(client, up["fitbox"].url, model)
                time.sleep(WARM_S)
                cpu_before = sum(own.cpu_times()[:2])
                rates = interleaved(systems, rounds, prompt_rate)
                cpu = sum(own.cpu_times()[:2]) - cpu_before
    added = [(f - d) * 1000 for f, d in zip(seconds["fitbox"], seconds["direct"], strict=True)]
    return rates, added, cpu


def same_window(client: httpx.Client, url: str, model: str) -> None:
    """The issue compares at the same window: fitbox's engine must hold direct's."""
    data = client.get(f"{url}/v1/residents").json()["data"]
    window = next(int(r["window"]) for r in data if r["model"] == model)
    if window != WINDOW:
        raise SystemExit(f"fitbox loaded {model} at a {window}-token window, direct at {WINDOW}")


if __name__ == "__main__":
    raise SystemExit(main())

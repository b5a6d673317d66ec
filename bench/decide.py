"""Decision time of the placement core: p50/p99 of core.decide() and how it grows.

The base case is the issue's: a catalog of 200 artifacts (the asked name resolves to its
variants among them), 16 residents and 8 GPUs. Each dimension is then grown alone. The
baseline printed alongside is the cost of pricing one whole-model footprint
(sizing.footprint), measured in the same run, so the ratio reads "decisions cost N
footprints".

    .venv/bin/python bench/decide.py
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fitbox.core import sizing
from fitbox.core.ask import Ask, Candidate
from fitbox.core.decide import decide
from fitbox.core.types import ResidentState, ResidentView, Snapshot
from tests.support.core_builders import GiB, gpu, host, model

RUNS = 400


def catalog(n: int, rng: random.Random) -> list[Candidate]:
    quants = [("F16", 16), ("Q8_0", 8), ("Q6_K", 6), ("Q4_K_M", 4)]
    out = []
    for i in range(n):
        quant, bits = quants[i % len(quants)]
        size = int((1 + i // 4 % 12) * bits / 8 * GiB)
        out.append(
            model(
                f"m{i // 4}.{quant}",
                size,
                n_layer=rng.choice([24, 32, 48, 64]),
                quant=quant,
                four_bit=bits == 4,
                moe=i % 12 == 0,
            )
        )
    return out


def snapshot(gpus: int, residents: int, rng: random.Random) -> Snapshot:
    devices = (*tuple(gpu(i, 24 * GiB) for i in range(gpus)), host(128 * GiB))
    views = []
    for i in range(residents):
        device = devices[i % len(devices)].id
        views.append(
            ResidentView(
                key=f"r{i}",
                device=device,
                bytes=rng.randint(1, 5) * GiB,
                state=ResidentState.READY,
                calls=rng.choice([0, 0, 1]),
                last_used=float(i),
                pinned=i % 7 == 0,
                cores=(i + 1,) if i < 30 else (),
                reload_seconds=float(i % 5 + 1),
            )
        )
    return Snapshot(devices, tuple(views), cores=tuple(range(32)))


def time_decisions(snap: Snapshot, cat: list[Candidate], variants: int) -> list[float]:
    times = []
    families = len(cat) // 4
    for run in range(RUNS):
        family = run % families
        chosen = tuple(cat[family * 4 : family * 4 + variants]) or (cat[0],)
        ask = Ask(f"m{family}", chosen, need=2000, window=8192)
        start = time.perf_counter()
        decide(snap, ask)
        times.append((time.perf_counter() - start) * 1000)
    return times


def report(label: str, times: list[float], baseline_ms: float) -> None:
    times.sort()
    p50, p99 = statistics.median(times), times[int(len(times) * 0.99) - 1]
    print(
        f"{label:<44} p50 {p50:6.3f} ms  p99 {p99:6.3f} ms  "
        f"({p50 / baseline_ms:5.1f} x one footprint)"
    )


def main() -> None:
    rng = random.Random(4)
    cat = catalog(200, rng)
    shape = cat[0].shape
    assert shape is not None
    start = time.perf_counter()
    for _ in range(2000):
        sizing.footprint(shape, 8192, 1)
    baseline = (time.perf_counter() - start) * 1000 / 2000
    print(f"baseline: one sizing.footprint() = {baseline:.4f} ms")
    base = snapshot(8, 16, rng)
    report("200 artifacts, 16 residents, 8 GPUs (base)", time_decisions(base, cat, 4), baseline)
    for gpus in (1, 2, 4, 16):
        report(f"  GPUs = {gpus}", time_decisions(snapshot(gpus, 16, rng), cat, 4), baseline)
    for residents in (0, 4, 64):
        report(
            f"  residents = {residents}",
            time_decisions(snapshot(8, residents, rng), cat, 4),
            baseline,
        )
    for size in (20, 1000):
        report(
            f"  catalog = {size} artifacts", time_decisions(base, catalog(size, rng), 4), baseline
        )
    for variants in (1, 2):
        report(f"  variants per name = {variants}", time_decisions(base, cat, variants), baseline)
    # GPUs too small for most models alone: the device-set search (issue #21) does its most
    small_gpus = snapshot(8, 16, rng)
    eight_small = (*tuple(gpu(i, 3 * GiB) for i in range(8)), host(128 * GiB))
    report(
        "  8 x 3 GiB GPUs: splits searched",
        time_decisions(Snapshot(eight_small, small_gpus.residents, small_gpus.cores), cat, 4),
        baseline,
    )
    crowded = snapshot(2, 16, rng)
    small = (*tuple(gpu(i, 2 * GiB) for i in range(2)), host(24 * GiB))
    report(
        "  tight box: partial offload searched",
        time_decisions(Snapshot(small, crowded.residents, crowded.cores), cat, 4),
        baseline,
    )


if __name__ == "__main__":
    main()

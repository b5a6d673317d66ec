"""A pull's staging writes alone (no network): models/landing.py's Landing fed from memory,
its pieces written with O_DIRECT (as a pull does) or through the page cache with write-back
started every 32 MiB (the baseline, as pulls did before), each ending with the fsync a pull
needs before its rename. Interleaved rounds; prints each median, its CPU seconds and the
ratio.

    python bench/landing_writes.py [--mib 375] [--rounds 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from fitbox.models import landing  # noqa: E402
from fitbox.models.landing import Landing  # noqa: E402


def land(path: Path, source: bytes, total: int, direct: bool) -> tuple[float, float]:
    """Wall and CPU seconds to land ``total`` bytes (``source`` repeated) and fsync them."""
    real_open = landing._open_direct
    if not direct:
        landing._open_direct = lambda part: None
    try:
        cpu, started = _cpu(), time.perf_counter()
        with path.open("w+b") as out, Landing(out.fileno(), path) as staging:
            at = 0
            while at < total:
                view = staging.buffer()[: min(Landing.PIECE, total - at)]
                view[:] = source[: len(view)]
                staging.write(view)
                at += len(view)
                if at % (4 << 20) == 0 or at == total:
                    staging.verified()
            staging.finish()
        return time.perf_counter() - started, _cpu() - cpu
    finally:
        landing._open_direct = real_open
        path.unlink()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=375)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", help="where the file goes (default: the temp dir)")
    args = parser.parse_args()
    source, total = os.urandom(Landing.PIECE), args.mib << 20
    runs: dict[str, list[tuple[float, float]]] = {"page cache": [], "O_DIRECT": []}
    with tempfile.TemporaryDirectory(prefix="fitbox-landing-", dir=args.dir) as tmp:
        for _ in range(args.rounds):
            for label in runs:
                runs[label].append(land(Path(tmp) / "x.part", source, total, label == "O_DIRECT"))
    print(f"landing {args.mib} MiB and its fsync, median of {args.rounds} interleaved rounds:")
    medians = {}
    for label, got in runs.items():
        wall, cpu = statistics.median(w for w, _ in got), statistics.median(c for _, c in got)
        medians[label] = wall
        print(
            f"  {label:10}  {wall:6.2f} s  {args.mib / wall:6.0f} MiB/s  {cpu:5.2f} CPU s "
            "(the whole sha256 included)"
        )
    print(f"  O_DIRECT / page cache time {medians['O_DIRECT'] / medians['page cache']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

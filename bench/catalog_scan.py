"""Catalog scan: 100 real model headers (hard links to SmolLM2, a 49k-token vocabulary
each), read cold (no facts cache) and warm (the on-disk cache a restarted fitbox reads).

    python bench/catalog_scan.py [--files 100]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fitbox.models.catalog import scan  # noqa: E402
from fitbox.models.facts_cache import FactsCache  # noqa: E402
from fitbox.models.pull import pull  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100)
    args = parser.parse_args()
    model = pull("smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models")
    with tempfile.TemporaryDirectory(dir=model.parent) as tmp:
        root = Path(tmp)
        for i in range(args.files):
            os.link(model, root / f"m{i:03d}.gguf")
        cache = root / "facts.json"
        started = time.perf_counter()
        cold = scan([root], FactsCache(cache))[0]
        cold_s = time.perf_counter() - started
        started = time.perf_counter()
        warm = scan([root], FactsCache(cache))[0]
        warm_s = time.perf_counter() - started
    assert len(cold) == len(warm) == args.files
    print(
        f"{args.files} model headers: cold {cold_s * 1000:.0f} ms "
        f"({cold_s / args.files * 1000:.1f} ms each), warm {warm_s * 1000:.1f} ms, "
        f"warm/cold {warm_s / cold_s:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

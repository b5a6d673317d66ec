"""An idle box must not wake readers: start fitbox, load a model with one call, then read
the change counter, wait, read it again.

    python bench/idle_counter.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.proxy_overhead import start_fitbox  # noqa: E402
from fitbox.models.pull import pull  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    model = pull("smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models")
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_fitbox(Path(tmp), model.parent)
        try:
            httpx.post(
                f"{url}/v1/completions",
                timeout=120,
                json={"model": "smollm2", "prompt": "hi", "max_tokens": 1},
            )
            time.sleep(1.0)
            before = httpx.get(f"{url}/v1/telemetry/state").json()["counter"]
            time.sleep(args.seconds)
            after = httpx.get(f"{url}/v1/telemetry/state").json()["counter"]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    per_minute = (after - before) * 60 / args.seconds
    print(
        f"idle for {args.seconds:.0f} s with a resident model: counter {before} -> {after}, "
        f"{per_minute:.1f} moves per minute"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

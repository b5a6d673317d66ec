"""Box-to-box transfer and scout: pull throughput against curl of the same file from the
same box in the same run, and scout's walk of a 100,000-directory tree.

    python bench/transfer.py [--rounds 5] [--copies 4] [--dirs 100000] [--work DIR]

The source is a real `fitbox serve` whose model store holds a GGUF of ``--copies`` times
SmolLM2's bytes (SmolLM2's header and tensors, then its bytes repeated: a real GGUF the
catalog lists, big enough that a round is not all start-up). Each round, interleaved: curl
fetches the file to disk (the baseline: one GET, no checking), then `fitbox pull`'s code
(box/transfers.py, in this process) pulls it into an empty store, every 4 MiB chunk and the
whole file's sha256 checked. Prints each median, the CPU seconds each spent (on a shared box
the wall times say as much about the neighbours as about the code), and pull/curl
throughput (aim >= 90 %).
Then scout walks the tree: all of it (depth 2, no directory limit) and within its default
limits, directories per second for each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from fitbox.box.transfers import pull_from_box  # noqa: E402
from fitbox.models.pull import pull  # noqa: E402
from fitbox.models.scout import Limits, scout  # noqa: E402
from fitbox.store.db import Store  # noqa: E402

NAME = "bench-transfer"


def start_fitbox(home: Path, models: Path) -> tuple[subprocess.Popen[bytes], str]:
    argv = [
        sys.executable,
        "-m",
        "fitbox",
        "serve",
        "--port",
        "auto",
        "--home",
        str(home),
        "--models",
        str(models),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300  # a loaded shared machine starts slowly
    while time.monotonic() < deadline:
        try:
            url = str(json.loads((home / "endpoint.json").read_text())["url"])
            if httpx.get(f"{url}/health").status_code == 200:
                return proc, url
        except (OSError, ValueError, KeyError, httpx.TransportError):
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("fitbox did not start")


def make_source_file(smol: Path, dest: Path, copies: int) -> None:
    """SmolLM2 followed by copies-1 more of its bytes: its header still describes it, the
    catalog lists it, and the file is ``copies`` times as long."""
    with dest.open("wb") as out:
        for _ in range(copies):
            with smol.open("rb") as f:
                shutil.copyfileobj(f, out, 8 << 20)


def bench_transfer(rounds: int, copies: int, work: Path) -> None:
    smol = pull("smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models")
    models = work / "source-models"
    models.mkdir()
    source = models / f"{NAME}.gguf"
    make_source_file(smol, source, copies)
    size = source.stat().st_size
    proc, url = start_fitbox(work / "source-home", models)
    try:
        httpx.get(f"{url}/v1/transfer/{NAME}/manifest", timeout=600).raise_for_status()  # hashed
        port = url.rsplit(":", 1)[1]
        curl_s, synced_s, pull_s = [], [], []
        curl_cpu, pull_cpu, source_curl, source_pull = [], [], [], []
        for i in range(rounds):
            out = work / f"curl-{i}"
            started, cpu = time.perf_counter(), _cpu(resource.RUSAGE_CHILDREN)
            served = _source_cpu(proc.pid)
            target = f"{url}/v1/transfer/{NAME}/file?path={source.name}"
            subprocess.run(["curl", "-sf", "-o", str(out), target], check=True)
            curl_s.append(time.perf_counter() - started)
            curl_cpu.append(_cpu(resource.RUSAGE_CHILDREN) - cpu)
            source_curl.append(_source_cpu(proc.pid) - served)
            assert out.stat().st_size == size
            out.unlink()
            started = time.perf_counter()  # curl, then the file made durable as a pull's is
            subprocess.run(["curl", "-sf", "-o", str(out), target], check=True)
            subprocess.run(["sync", str(out)], check=True)
            synced_s.append(time.perf_counter() - started)
            out.unlink()
            dest = work / f"pull-{i}"
            store = Store(dest / "fitbox.sqlite3")
            try:
                started, cpu = time.perf_counter(), _cpu(resource.RUSAGE_SELF)
                served = _source_cpu(proc.pid)
                (outcome,) = pull_from_box(f"box://127.0.0.1:{port}/{NAME}", dest / "models", store)
                pull_s.append(time.perf_counter() - started)
                pull_cpu.append(_cpu(resource.RUSAGE_SELF) - cpu)
                source_pull.append(_source_cpu(proc.pid) - served)
            finally:
                store.close()
            assert outcome.size == size and outcome.reused_chunks == 0
            shutil.rmtree(dest)
    finally:
        proc.terminate()
        proc.wait(30)
    curl_m, pull_m = statistics.median(curl_s), statistics.median(pull_s)
    synced_m = statistics.median(synced_s)
    mib = size / (1 << 20)
    print(f"transfer of {mib:.0f} MiB over loopback, median of {rounds} interleaved rounds:")
    curl_c, pull_c = statistics.median(curl_cpu), statistics.median(pull_cpu)
    print(f"  curl            {curl_m:6.2f} s  {mib / curl_m:7.0f} MiB/s  {curl_c:5.2f} CPU s")
    print(f"  curl + sync     {synced_m:6.2f} s  {mib / synced_m:7.0f} MiB/s  (durable, as a pull)")
    print(
        f"  fitbox pull     {pull_m:6.2f} s  {mib / pull_m:7.0f} MiB/s  {pull_c:5.2f} CPU s  "
        "(chunks + whole sha256)"
    )
    print(
        f"  the source box's CPU serving it: {statistics.median(source_curl):.2f} s to curl, "
        f"{statistics.median(source_pull):.2f} s to the pull"
    )
    print(
        f"  pull/curl throughput {curl_m / pull_m:.1%} (aim >= 90 %); "
        f"pull/(curl + sync) {synced_m / pull_m:.1%}"
    )


def _cpu(who: int) -> float:
    """User + system CPU seconds so far: of this process (the pull's threads; the source is
    a child that is still running, so not counted) or of the children that ended (curl)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _source_cpu(pid: int) -> float:
    """User + system CPU seconds of the running source box (/proc: 10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_scout(dirs: int, work: Path) -> None:
    top = work / "wide"
    per = 1000
    started = time.perf_counter()
    for i in range(dirs // per):
        parent = top / f"d{i:03d}"
        parent.mkdir(parents=True)
        for j in range(per):
            os.mkdir(parent / f"e{j:04d}")
    made_s = time.perf_counter() - started
    print(f"scout on a {dirs:,}-directory tree (made in {made_s:.1f} s):")
    for label, limits in (
        ("whole tree", Limits(max_depth=2, max_dirs=10 * dirs)),
        ("default limits", Limits()),
    ):
        started = time.perf_counter()
        report = scout([top], env={}, home=work, limits=limits, mountinfo=work / "none")
        took = time.perf_counter() - started
        t = report.tally
        reached = ", limit reached" if t.dirs_left else ""
        print(
            f"  {label:15} {took:6.2f} s  {t.dirs_visited:>7,} directories listed "
            f"({t.dirs_visited / took:,.0f}/s){reached}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--dirs", type=int, default=100_000)
    parser.add_argument(
        "--work",
        metavar="DIR",
        help="where the files go (default: the temp dir;"
        " /dev/shm takes the disk out of the comparison)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fitbox-bench-", dir=args.work) as tmp:
        bench_transfer(args.rounds, args.copies, Path(tmp))
        bench_scout(args.dirs, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

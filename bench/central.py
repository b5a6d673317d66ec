"""The central, one run: what it adds to a call, how far its mirror lags, what syncing costs.

    python bench/central.py [--requests 100] [--lag-calls 50] [--rows 10000]
                            [--central-store sqlite|postgresql]

1. Latency: short completions (max_tokens=1) to llama-server directly, through the box,
   and through a central in front of that box, interleaved; p50 and p95 of each, the box's
   added latency over llama-server and the central's over the box (the aim: the central
   adds no more than the box does). First the box alone, before it joins the central (what
   bench/side_by_side.py sees: no mirror reading it), then with the central following it.
   Then CPU per call of the central's and the box's processes, each path in a batch of its
   own (the central's CPU on calls made to the box directly is its mirror's cost).
2. Mirror lag: a call made on the box directly, then the time from its reply until the
   central serves its row in its final form (polled every millisecond); p50 and p99.
3. Sync cost, in process, on SQLite and on PostgreSQL (a throwaway cluster this run
   starts, tests/support/postgres.py, with PostgreSQL's own durable defaults): --rows call rows
   landed by the mirror's own page write (CentralStore.take_page: checked, upserted, cursor
   stored, one transaction per page of 1000) against a plain executemany of the same rows
   into a table with the same key, one transaction per 1000 too; seconds per 10k rows and
   the ratio, for each store. A first pass lands new rows, a second replays the same ones
   (what a restart of either side costs: every row an update).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.proxy_overhead import MODEL, REPO, child_url, percentile
from fitbox.central.backend import StoreTarget
from fitbox.central.store import CentralStore
from fitbox.models.pull import pull
from tests.support.postgres import APT, PostgresCluster, postgres_bin


def _answering(proc: subprocess.Popen[bytes], endpoint: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("a fitbox process exited at start")
        try:
            url = str(json.loads(endpoint.read_text())["url"])
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return url
        except (OSError, ValueError, KeyError, httpx.TransportError):
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"nothing answered at {endpoint}")


def _start(
    argv: list[str], endpoint: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fitbox", *argv, "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    return proc, _answering(proc, endpoint)


def short_call(client: httpx.Client, base: str, model: str = MODEL) -> float:
    body = {"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    for attempt in (1, 2):
        started = time.perf_counter()
        try:
            response = client.post(f"{base}/v1/completions", json=body)
        except httpx.RemoteProtocolError:  # llama-server drops idle keep-alives unannounced
            if attempt == 2:
                raise
            continue
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        return elapsed
    raise AssertionError("unreachable")


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def cpu_per_call(
    client: httpx.Client, base: str, calls: int, pids: dict[str, int]
) -> dict[str, float]:
    """Seconds of CPU each process spent per call, over ``calls`` calls to ``base`` (and
    the quarter second after, for what the calls set off: the mirror's reads)."""
    before = {name: _cpu_s(pid) for name, pid in pids.items()}
    for _ in range(calls):
        short_call(client, base)
    time.sleep(0.25)
    return {name: (_cpu_s(pid) - before[name]) / calls for name, pid in pids.items()}


def interleaved(
    client: httpx.Client, paths: list[tuple[str, str]], requests: int
) -> dict[str, list[float]]:
    lat: dict[str, list[float]] = {name: [] for name, _ in paths}
    for i in range(requests):
        for name, base in paths if i % 2 else list(reversed(paths)):
            lat[name].append(short_call(client, base))
    return lat


def join(client: httpx.Client, central: str, box: str, home: Path) -> None:
    """Register the box as ``fitbox serve --central`` does (server/manage/joining.py)."""
    health = client.get(f"{box}/health").json()
    body = {
        "box_id": health["box_id"],
        "name": health["name"],
        "version": health["version"],
        "url": box,
        "admin_key": (home / "box.key").read_text().strip(),
    }
    client.post(f"{central}/v1/boxes", json=body).raise_for_status()


def newest_final_id(client: httpx.Client, central: str, box_id: str) -> int:
    rows = client.get(
        f"{central}/v1/telemetry/rows",
        params={"table": "call_log", "box_id": box_id, "desc": "true", "limit": 1},
    ).json()["rows"]
    return int(rows[0]["id"]) if rows and rows[0]["outcome"] != "pending" else 0


def _resident_seen(client: httpx.Client, central: str, box_id: str) -> bool:
    models = client.get(f"{central}/v1/models").json()["data"]
    return any(m["resident"] for m in models if m.get("box_id") == box_id)


def mirror_lag(
    client: httpx.Client, box: str, central: str, box_id: str, calls: int
) -> list[float]:
    lags = []
    for _ in range(calls):
        before = newest_final_id(client, central, box_id)
        short_call(client, box)
        replied = time.perf_counter()
        while newest_final_id(client, central, box_id) <= before:
            time.sleep(0.001)
        lags.append(time.perf_counter() - replied)
    return lags


def _page(rows: int) -> list[dict[str, object]]:
    return [
        {
            "id": i,
            "seq": i,
            "request_id": f"r{i}",
            "endpoint": "/v1/completions",
            "outcome": "ok",
            "received_at": 1.0 + i,
            "prompt_tokens": 5,
            "completion_tokens": 1,
        }
        for i in range(1, rows + 1)
    ]


def _mirror_cost(target: StoreTarget, page: list[dict[str, object]]) -> tuple[float, float]:
    """Seconds for the mirror to land ``page`` new, then the same rows again (a replay)."""
    store = CentralStore(target)
    took = []
    try:
        for _ in ("new", "replayed"):
            started = time.perf_counter()
            for first in range(0, len(page), 1000):
                chunk = page[first : first + 1000]
                store.take_page("box", "call_log", "seq", chunk, first + len(chunk))
            took.append(time.perf_counter() - started)
    finally:
        store.close()
    return took[0], took[1]


def _plain_params(page: list[dict[str, object]], first: int) -> list[tuple[object, ...]]:
    return [(r["id"], r["seq"], json.dumps(r)) for r in page[first : first + 1000]]


def sync_cost_sqlite(page: list[dict[str, object]], folder: Path) -> tuple[float, float, float]:
    """(mirror new, mirror replayed, plain executemany) seconds on SQLite."""
    new, replayed = _mirror_cost(folder / "central.sqlite3", page)
    conn = sqlite3.connect(folder / "plain.sqlite3", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(
        "CREATE TABLE t (box_id TEXT, tbl TEXT, source_id INTEGER, seq INTEGER, "
        "data TEXT, PRIMARY KEY (box_id, tbl, source_id))"
    )
    started = time.perf_counter()
    for first in range(0, len(page), 1000):
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO t VALUES ('box', 'call_log', ?, ?, ?)", _plain_params(page, first)
        )
        conn.execute("COMMIT")
    plain = time.perf_counter() - started
    conn.close()
    return new, replayed, plain


def sync_cost_postgres(page: list[dict[str, object]]) -> tuple[float, float, float] | str:
    """The same on a PostgreSQL cluster of this run's own; the reason when there is none."""
    if postgres_bin() is None:
        return f"no PostgreSQL here ({APT})"
    import psycopg

    cluster = PostgresCluster.start(durable=True)
    try:
        new, replayed = _mirror_cost(cluster.create_database(), page)
        with psycopg.connect(cluster.create_database(), autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE t (box_id TEXT, tbl TEXT, source_id BIGINT, seq BIGINT, "
                "data TEXT, PRIMARY KEY (box_id, tbl, source_id))"
            )
            started = time.perf_counter()
            for first in range(0, len(page), 1000):
                with conn.transaction(), conn.cursor() as cursor:
                    cursor.executemany(
                        "INSERT INTO t VALUES ('box', 'call_log', %s, %s, %s)",
                        _plain_params(page, first),
                    )
            plain = time.perf_counter() - started
    finally:
        cluster.stop()
    return new, replayed, plain


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--lag-calls", type=int, default=50)
    parser.add_argument("--rows", type=int, default=10000)
    parser.add_argument(
        "--central-store",
        choices=["sqlite", "postgresql"],
        default="sqlite",
        help="the store of the central that parts 1 and 2 measure",
    )
    args = parser.parse_args()
    model_path = pull(
        "smollm2", Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models"
    )
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as cleanup:
        root = Path(tmp)
        env = {}
        if args.central_store == "postgresql":
            cluster = PostgresCluster.start(durable=True)
            cleanup.callback(cluster.stop)
            env["FITBOX_CENTRAL_DB"] = cluster.create_database()
        central_proc, central = _start(
            ["central", "serve", "--port", "auto", "--home", str(root / "central")],
            root / "central" / "central-endpoint.json",
            env,
        )
        box_proc, box = _start(
            [
                "serve",
                "--port",
                "auto",
                "--home",
                str(root / "box"),
                "--models",
                str(model_path.parent),
            ],
            root / "box" / "endpoint.json",
        )
        try:
            box_id = httpx.get(f"{box}/health").json()["box_id"]
            with httpx.Client(timeout=120, limits=httpx.Limits(keepalive_expiry=2.0)) as client:
                short_call(client, box)  # loads the model
                direct = child_url(box_proc.pid)
                alone = [("direct", direct), ("box", box)]
                for _ in range(10):
                    for _, base in alone:
                        short_call(client, base)
                unfollowed = interleaved(client, alone, args.requests)
                cpu_alone = cpu_per_call(client, box, args.requests, {"box": box_proc.pid})
                join(client, central, box, root / "box")
                deadline = time.monotonic() + 30
                while not _resident_seen(client, central, box_id):
                    if time.monotonic() > deadline:
                        raise SystemExit("the central never saw the box's model resident")
                    time.sleep(0.05)
                paths = [("direct", direct), ("box", box), ("central", central)]
                for _ in range(10):
                    for _, base in paths:
                        short_call(client, base)
                lat = interleaved(client, paths, args.requests)
                pids = {"central": central_proc.pid, "box": box_proc.pid}
                cpu = {
                    name: cpu_per_call(client, base, args.requests, pids) for name, base in paths
                }
                lags = mirror_lag(client, box, central, box_id, args.lag_calls)
        finally:
            for proc in (box_proc, central_proc):
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        page = _page(args.rows)
        costs = {"SQLite": sync_cost_sqlite(page, root), "PostgreSQL": sync_cost_postgres(page)}

    ms = 1000.0
    p50 = {name: percentile(v, 50) * ms for name, v in lat.items()}
    p95 = {name: percentile(v, 95) * ms for name, v in lat.items()}
    print(f"short completions ({args.requests} each, max_tokens=1, interleaved)")
    for label, p in (("p50", p50), ("p95", p95)):
        print(
            f"  {label}  direct {p['direct']:7.2f} ms   box {p['box']:7.2f} ms   central "
            f"{p['central']:7.2f} ms"
        )
    solo = {name: percentile(v, 50) * ms for name, v in unfollowed.items()}
    print(
        f"  before the box joined the central (no mirror reading it): p50 direct "
        f"{solo['direct']:7.2f} ms   box {solo['box']:7.2f} ms, box added "
        f"{solo['box'] - solo['direct']:+.2f} ms; the box's CPU per call "
        f"{cpu_alone['box'] * ms:.2f} ms"
    )
    print(
        f"  CPU per call ({args.requests} calls a path, batched), ms: "
        + "; ".join(
            f"{path}: central {c['central'] * ms:.2f}, box {c['box'] * ms:.2f}"
            for path, c in cpu.items()
        )
    )
    box_added, central_added = p50["box"] - p50["direct"], p50["central"] - p50["box"]
    print(
        f"  p50 added: box over llama-server {box_added:+.2f} ms, central over box "
        f"{central_added:+.2f} ms, ratio central/box added {central_added / box_added:.2f}"
    )
    print(
        f"mirror lag ({args.lag_calls} calls, reply on the box -> final row on the central, "
        f"central on {args.central_store})"
    )
    print(f"  p50 {percentile(lags, 50) * ms:.1f} ms   p99 {percentile(lags, 99) * ms:.1f} ms")
    per_10k = 10000 / args.rows
    print(f"sync cost, {args.rows} call rows in pages of 1000, seconds per 10k rows")
    for store, cost in costs.items():
        if isinstance(cost, str):
            print(f"  {store:10s} not measured: {cost}")
            continue
        new, replayed, plain = (c * per_10k for c in cost)
        print(
            f"  {store:10s} mirror new {new:.3f} s, replayed {replayed:.3f} s; plain "
            f"executemany {plain:.3f} s; ratio mirror/plain {new / plain:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

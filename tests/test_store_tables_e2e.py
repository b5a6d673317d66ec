"""Readings, evictions, pulls, the read-only table surface and the calls page, on a real
fitbox: readings never move the change counter; events do; secrets never leave."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support.ggufs import two_models_one_at_a_time, write_tiny_llama
from .support.holds import until
from .support.local_http import serve_directory
from .support.processes import running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"


def replay(url: str, table: str, since: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(
        f"{url}/v1/telemetry", params={"table": table, "since": since, "limit": 1000}, timeout=30
    ).json()
    return body


def counter(url: str) -> int:
    return int(httpx.get(f"{url}/v1/telemetry/state", timeout=30).json()["counter"])


def test_readings_are_kept_bounded_and_never_move_the_counter(tmp_path: Path) -> None:
    """Judged by the readings' own clock (each tick's ``at``), never the test's: a reading is
    kept while the newest is less than the 1 s retention younger, and gone once the sensors
    have ticked past a prune that had to take it (with 1 s retention, each tick a second
    after the last prune prunes)."""
    env = {
        "FITBOX_READING_INTERVAL": "0.05",
        "FITBOX_READING_RETENTION": "1",
        "FITBOX_SIMULATED_GPUS": "8GiB",
    }
    (tmp_path / "models").mkdir()
    with running_fitbox(tmp_path / "home", [tmp_path / "models"], env=env) as box:
        start = counter(box.url)
        oldest = until(lambda: replay(box.url, "resource_log")["rows"], "a first reading")[0]

        def pruned_for_sure() -> dict[str, Any] | None:
            rows = replay(box.url, "resource_log", oldest["id"] - 1)
            ticks = sorted({r["at"] for r in rows["rows"]})
            kept = bool(rows["rows"]) and rows["rows"][0]["id"] == oldest["id"]
            if not kept:  # pruned: never before it was older than the retention
                assert ticks and ticks[-1] - oldest["at"] > 1, (oldest, ticks[-1:])
            past = [t for t in ticks if t > oldest["at"] + 2]  # retention + a prune's period
            return rows if len(past) >= 2 else None  # a tick after the prune that took it

        rows = until(pruned_for_sure, "two sensor ticks past the prune of the first reading")
        assert rows["rows"][0]["id"] > oldest["id"]  # gone: retention bounds the readings
        assert rows["cursor"] == "id"
        devices = {r["device"] for r in rows["rows"]}
        assert devices == {"host", "gpu0"}
        gpu = next(r for r in rows["rows"] if r["device"] == "gpu0")
        assert gpu["simulated"] == 1 and gpu["total_bytes"] == 8 << 30
        host = next(r for r in rows["rows"] if r["device"] == "host")
        assert host["free_bytes"] > 0 and host["busy_percent"] is not None
        assert counter(box.url) == start  # dozens of readings later: readings are not events
        later = replay(box.url, "resource_log", rows["next"])
        assert all(r["id"] > rows["next"] for r in later["rows"])


def test_evictions_are_events_with_their_reason(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    root = tmp_path / "models"
    cap = two_models_one_at_a_time(root, smollm2)
    with running_fitbox(tmp_path / "home", [root], "--ram-max", str(cap)) as box:
        for model in ("tiny", SMOL):
            reply = httpx.post(
                f"{box.url}/v1/completions",
                timeout=60,
                json={"model": model, "prompt": "hi", "max_tokens": 1},
            )
            assert reply.status_code == 200
        before = counter(box.url)
        assert (
            httpx.post(
                f"{box.url}/v1/operator/unload", json={"model": SMOL}, timeout=30
            ).status_code
            == 200
        )
        rows = until(
            lambda: (found := replay(box.url, "evictions")["rows"])[1:] and found,
            "both evictions replayed",
        )
        made_room, operator = rows
        assert (made_room["model"], made_room["reason"], made_room["for_model"]) == (
            "tiny",
            "make_room",
            SMOL,
        )
        assert made_room["call_id"] == box.calls()[-1]["id"]
        assert (operator["model"], operator["reason"]) == (SMOL, "operator")
        assert counter(box.url) > before  # an eviction is an event


@pytest.fixture
def model_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    served = tmp_path / "www"
    served.mkdir()
    write_tiny_llama(served / "mirror.gguf")
    with serve_directory(served) as url:
        yield url, served / "mirror.gguf"


def test_every_pull_is_a_row(tmp_path: Path, model_server: tuple[str, Path]) -> None:
    url, source = model_server
    home, models = tmp_path / "home", tmp_path / "models"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()

    def pull(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "fitbox",
                "pull",
                *args,
                "--home",
                str(home),
                "--models",
                str(models),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert pull(f"{url}/mirror.gguf", "--sha256", digest).returncode == 0
    assert pull(f"{url}/missing.gguf", "--sha256", digest).returncode == 1
    with running_fitbox(home, [models]) as box:
        ok, failed = replay(box.url, "pulls")["rows"]
    assert (ok["outcome"], ok["verified"], ok["bytes"]) == ("ok", 1, source.stat().st_size)
    assert ok["path"] == str(models / "mirror.gguf")
    assert failed["outcome"] == "error" and "404" in failed["detail"]


def test_tables_and_rows_are_read_only_and_withhold_secrets(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with running_fitbox(tmp_path / "home", [tmp_path / "models"]) as box:
        listed = {t["name"]: t for t in httpx.get(f"{box.url}/v1/telemetry/tables").json()["data"]}
        assert {
            "call_log",
            "evictions",
            "pulls",
            "resource_log",
            "recent_speeds",
            "latest_footprints",
            "settings",
        } <= set(listed)
        assert listed["recent_speeds"]["kind"] == "view"
        assert listed["api_keys"]["withheld"] == ["digest", "salt"]
        assert "digest" not in listed["api_keys"]["columns"]
        keys = httpx.get(
            f"{box.url}/v1/telemetry/rows",
            params={"table": "api_keys", "order": "created_at", "desc": "true"},
        ).json()["rows"]
        assert keys and all("digest" not in k and "salt" not in k for k in keys)
        assert keys[0]["is_box_key"] == 1
        for bad, param in (
            ({"table": "nope"}, "table"),
            ({"table": "api_keys", "order": "digest"}, "order"),
            ({"table": "call_log", "order": "id; DROP TABLE call_log"}, "order"),
            ({"table": "call_log", "limit": "0"}, "limit"),
        ):
            response = httpx.get(f"{box.url}/v1/telemetry/rows", params=bad)
            assert response.status_code == 400 and response.json()["error"]["param"] == param
        outside = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3"))
        with outside:
            refused = outside.get(f"{box.url}/v1/telemetry/rows", params={"table": "call_log"})
        assert refused.status_code == 401  # a read key, or the box itself


def test_the_calls_page_is_for_the_box_itself_and_admin_keys(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    with running_fitbox(tmp_path / "home", [smollm2.parent]) as box:
        httpx.post(
            f"{box.url}/v1/chat/completions",
            timeout=60,
            json={
                "model": "smollm2",
                "messages": [{"role": "user", "content": "<b>hi</b>"}],
                "max_tokens": 4,
            },
        )
        box.calls()
        page = httpx.get(f"{box.url}/calls")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "smollm2" in page.text and "ram-only" in page.text
        box_key = (box.home / "box.key").read_text().strip()
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3")) as outside:
            refused = outside.get(f"{box.url}/calls")
            admin = outside.get(f"{box.url}/calls", headers={"Authorization": f"Bearer {box_key}"})
        assert refused.status_code == 401  # another machine needs an admin key (or session)
        assert refused.json()["error"]["code"] == "missing_api_key"
        assert admin.status_code == 200 and "smollm2" in admin.text
        forwarded = httpx.get(f"{box.url}/calls", headers={"X-Forwarded-For": "203.0.113.9"})
        assert forwarded.status_code == 401  # a forwarded request is never the box itself


def test_a_process_appearing_on_or_leaving_a_gpu_is_an_event(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    env = {"FITBOX_SIMULATED_GPUS": "1GiB", "FITBOX_READING_INTERVAL": "0.05"}
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        reply = httpx.post(
            f"{box.url}/v1/completions",
            timeout=60,
            json={"model": SMOL, "prompt": "hi", "max_tokens": 1},
        )
        assert reply.status_code == 200
        (resident,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
        assert resident["device"] == "gpu0"

        def changes() -> list[dict[str, Any]]:
            rows: list[dict[str, Any]] = replay(box.url, "gpu_processes")["rows"]
            return rows

        # unloaded only once a sensor tick has seen it: how soon the next tick comes after
        # the load is the machine's business, not the test's
        until(changes, "the child appearing")
        httpx.post(f"{box.url}/v1/operator/unload", json={"model": SMOL}, timeout=30)
        until(lambda: len(changes()) >= 2, "the child leaving")
        appeared, left = changes()
        assert (appeared["change"], appeared["pid"], appeared["device"]) == (
            "appeared",
            resident["pid"],
            "gpu0",
        )
        assert appeared["ours"] == 1 and appeared["simulated"] == 1
        assert (left["change"], left["pid"], left["ours"]) == ("left", resident["pid"], 1)


def test_process_changes_are_diffed_per_device() -> None:
    from fitbox.box.sensors import diff_processes

    before = {"gpu0": {10: 1, 11: 2}, "gpu1": {20: 5}}
    after = {"gpu0": {11: 2, 12: 3}}
    assert diff_processes(before, after) == [
        ("gpu0", 12, "appeared", 3),
        ("gpu0", 10, "left", 1),
        ("gpu1", 20, "left", 5),
    ]
    assert diff_processes(after, after) == []

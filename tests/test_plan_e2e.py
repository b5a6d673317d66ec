"""`fitbox plan` and GET /v1/plan: estimate first, measurement after a real load, and the
measurement kept in the store for the next fitbox (read without a running service)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support.processes import running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"


def plan_cli(home: Path, models: Path, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fitbox",
            "plan",
            *args,
            "--json",
            "--home",
            str(home),
            "--models",
            str(models),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_a_measured_load_turns_the_plan_from_estimate_to_measured(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    home, models = tmp_path / "home", smollm2.parent
    before = plan_cli(home, models, "smollm2")
    assert (before["basis"], before["decision"], before["device"]) == ("estimate", "place", "host")
    assert "offline" in before["source"]
    with running_fitbox(home, [models]) as box:
        served = plan_cli(home, models, "smollm2")
        assert served["basis"] == "estimate" and "running fitbox" in served["source"]
        reply = httpx.post(
            f"{box.url}/v1/chat/completions",
            timeout=60,
            json={
                "model": "smollm2",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
        )
        assert reply.status_code == 200
        after = httpx.get(f"{box.url}/v1/plan", params={"model": "smollm2"}).json()
        assert after["basis"] == "measured"
        row = after["devices"][0]
        assert row["kv_bytes"] == before["devices"][0]["kv_bytes"] == 94_371_840  # exact
        assert abs(row["weights_bytes"] - 96_576_768) < 0.01 * 2**20  # printed in 0.01 MiB
        estimated = before["devices"][0]["compute_bytes"]
        assert row["compute_bytes"] != estimated  # the engine's own figure, not ours
        assert abs(row["compute_bytes"] - estimated) < 0.10 * estimated
        calls = box.calls()
    offline = plan_cli(home, models, "smollm2")
    assert offline["basis"] == "measured" and "offline" in offline["source"]
    import sqlite3

    with sqlite3.connect(home / "fitbox.sqlite3") as conn:
        (call_id,) = conn.execute("SELECT call_id FROM measured_footprints").fetchone()
    assert call_id == calls[0]["id"]  # the measurement points at the call that loaded it


def test_plan_refuses_with_numbers_and_rejects_bad_input(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    with running_fitbox(tmp_path / "home", [smollm2.parent], "--ram-max", "64MiB") as box:
        refused = httpx.get(f"{box.url}/v1/plan", params={"model": "smollm2"}).json()
        assert refused["decision"] == "refuse" and refused["available_bytes"] == 64 << 20
        assert refused["needed_bytes"] == refused["devices"][0]["total_bytes"]
        for params in ({}, {"model": "smollm2", "ctx": "-1"}, {"model": "smollm2", "kv": "q9"}):
            response = httpx.get(f"{box.url}/v1/plan", params=params)
            assert response.status_code == 400, params
            assert set(response.json()["error"]) == {"message", "type", "code", "param"}
        missing = httpx.get(f"{box.url}/v1/plan", params={"model": "nope"})
        assert missing.status_code == 404


def test_rungs_reach_the_engine_split_across_two_simulated_gpus_then_ram_pinned(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """Two 80 MiB simulated GPUs: SmolLM2 (~124 MiB on a GPU) fits neither alone, so the core
    splits it; the real llama-server (a CPU build: the GPU flags are accepted, the work runs on
    the CPU) loads it with those flags. ``@ram`` pins it to host RAM."""
    env = {"FITBOX_SIMULATED_GPUS": "80MiB,80MiB"}
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        plan = httpx.get(f"{box.url}/v1/plan", params={"model": "smollm2"}).json()
        assert (plan["decision"], plan["rung"]) == ("place", "gpu-only")
        assert [d["device"] for d in plan["devices"]] == ["gpu0", "gpu1", "host"]
        assert len(plan["tensor_split"]) == 2 and plan["gpu_layers"] == 31
        reply = httpx.post(
            f"{box.url}/v1/chat/completions",
            timeout=60,
            json={
                "model": "smollm2",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
        )
        assert reply.status_code == 200, reply.text
        (resident,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
        assert resident["rung"] == "gpu-only" and len(resident["tensor_split"]) == 2
        assert set(resident["devices"]) == {"gpu0", "gpu1", "host"} and resident["cores"]
        argv = Path(f"/proc/{resident['pid']}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(b"-ngl") + 1] == b"31" and b"-ts" in argv
        assert argv[argv.index(b"-t") + 1] == str(len(resident["cores"])).encode()
        pinned = httpx.get(f"{box.url}/v1/plan", params={"model": "smollm2@ram"}).json()
        assert pinned["rung"] == "ram-only" and pinned["device"] == "host"
        assert {r["rung"] for r in pinned["rejected"]} == set()  # the pin left one rung


def test_engine_timings_land_in_the_call_log_and_become_speeds_the_core_reads(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    home = tmp_path / "home"
    with running_fitbox(home, [smollm2.parent]) as box:
        before = httpx.get(
            f"{box.url}/v1/plan", params={"model": "smollm2", "max_tokens": "100"}
        ).json()
        assert before["predicted_seconds"] is None  # nothing measured: no time is invented
        reply = httpx.post(
            f"{box.url}/v1/chat/completions",
            timeout=60,
            json={
                "model": "smollm2",
                "messages": [{"role": "user", "content": "Count to ten."}],
                "max_tokens": 16,
                "ignore_eos": True,
            },
        )
        assert reply.status_code == 200
        row = box.calls()[-1]
        assert row["rung"] == "ram-only" and row["type_k"] == "f16"
        assert json.loads(row["devices"]).keys() == {"host"} and json.loads(row["cores"])
        assert row["decode_per_token_ms"] > 0 and row["prompt_ms"] > 0
        speeds = httpx.get(f"{box.url}/v1/telemetry", params={"table": "measured_speeds"}).json()[
            "rows"
        ]
        assert len(speeds) == 1 and speeds[0]["call_id"] == row["id"]
        assert speeds[0]["decode_per_token_ms"] == row["decode_per_token_ms"]
    with running_fitbox(home, [smollm2.parent]) as box:  # read back from the store's view
        after = httpx.get(
            f"{box.url}/v1/plan", params={"model": "smollm2", "max_tokens": "100"}
        ).json()
        load = after["predicted_seconds"] - 100 * speeds[0]["decode_per_token_ms"] / 1000
        assert 0 < load < 60  # T = measured load seconds + 100 tokens at the measured rate

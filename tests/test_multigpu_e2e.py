"""Multi-GPU placement end to end (issue #21): the window first, from `fitbox plan` to the
real llama-server's argv, on declared simulated GPUs.

The engine here is a CPU build: it accepts -ngl and -ts and runs every layer on the CPU,
so what is real is the argv the core's split produced and the core's estimate per device;
the engine's own buffers are one CPU total, compared with the estimate's sum."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from fitbox.engines.load_log import parse_load_log
from fitbox.models.catalog import scan

from .support.core_builders import smollm2 as smollm2_candidate
from .support.processes import running_fitbox

THREE_110 = {"FITBOX_SIMULATED_GPUS": "110MiB,110MiB,110MiB"}


def plan(
    home: Path, models: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "fitbox",
            "plan",
            "smollm2",
            "--ctx",
            "4096",
            "--home",
            str(home),
            "--models",
            str(models),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_the_core_scenarios_use_the_real_files_numbers(smollm2: Path) -> None:
    """tests/core_builders.smollm2() is what models/ reads from the real GGUF's header."""
    (artifact,) = scan([smollm2.parent])[0]
    built = smollm2_candidate()
    assert artifact.facts.shape == built.shape and artifact.facts.layout == built.layout


def test_plan_shows_the_window_each_gpu_count_would_give(tmp_path: Path, smollm2: Path) -> None:
    text = plan(tmp_path / "home", smollm2.parent, THREE_110)
    assert text.returncode == 0, text.stderr
    assert "window 4096 x 4 slot(s)"  # FITBOX_PARALLEL: 4 unified slots in text.stdout
    assert (
        "by GPU count: 1 -> none (no_window), 2 -> 3072 (smaller_window), 3 -> 4096 (chosen)"
    ) in text.stdout
    report: dict[str, Any] = json.loads(
        plan(tmp_path / "home", smollm2.parent, THREE_110, "--json").stdout
    )
    assert [(c["count"], c["window"], c["reason"]) for c in report["device_counts"]] == [
        (1, 0, "no_window"),
        (2, 3072, "smaller_window"),
        (3, 4096, "chosen"),
    ]
    assert report["device_counts"][2]["devices"] == ["gpu0", "gpu1", "gpu2"]


@pytest.mark.engine
def test_three_110_mib_gpus_split_at_4096_reaches_the_engines_argv(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    home = tmp_path / "home"
    with running_fitbox(home, [smollm2.parent], env=THREE_110) as box:
        planned = httpx.get(f"{box.url}/v1/plan", params={"model": "smollm2"}).json()
        assert (planned["window"], len(planned["tensor_split"])) == (4096, 3)
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
        assert set(resident["devices"]) == {"gpu0", "gpu1", "gpu2", "host"}
        argv = Path(f"/proc/{resident['pid']}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(b"-c") + 1] == b"4096" and argv[argv.index(b"-ngl") + 1] == b"31"
        shares = [float(s) for s in argv[argv.index(b"-ts") + 1].split(b",")]
        assert len(shares) == 3 and len(set(shares)) == 1  # three equal GPUs: equal shares
        environ = dict(
            line.split(b"=", 1)
            for line in Path(f"/proc/{resident['pid']}/environ").read_bytes().split(b"\0")
            if b"=" in line
        )
        # -ts has one share per *visible* device: the child sees exactly the split's GPUs
        assert environ[b"CUDA_VISIBLE_DEVICES"] == b"0,1,2"
        assert environ[b"CUDA_DEVICE_ORDER"] == b"PCI_BUS_ID"
        (log,) = (home / "logs").glob("SmolLM2*.log")
        measured = parse_load_log(log.read_text(errors="replace"))
    estimate = {row["device"]: row for row in planned["devices"]}
    # the KV cache does not depend on where its layers are: the engine's one CPU buffer is
    # the sum of the three GPUs' estimated shares, to the byte
    assert sum(measured.kv_buffers.values()) == sum(r["kv_bytes"] for r in estimate.values())
    print(
        "estimate per device (MiB):",
        {d: round(r["total_bytes"] / 2**20, 2) for d, r in estimate.items()},
    )
    print(
        "measured buffers (MiB, CPU build):",
        {
            kind: {name: round(b / 2**20, 2) for name, b in buffers.items()}
            for kind, buffers in (
                ("model", measured.model_buffers),
                ("kv", measured.kv_buffers),
                ("compute", measured.compute_buffers),
                ("output", measured.output_buffers),
            )
        },
    )
    print("argv -ts:", argv[argv.index(b"-ts") + 1].decode())

"""Settings, limits, cores and verdicts on a real fitbox with a real llama-server: each knob
changes what the next call gets, survives a restart, and bad values are refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from .support.holds import Background, calls_on, engine_stopped, until
from .support.processes import running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"


def chat(url: str, model: str = "smollm2") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{url}/v1/chat/completions", timeout=60, json=body)


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30)


def test_limits_refuse_above_the_device_apply_at_once_and_survive_a_restart(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    home = tmp_path / "home"
    with running_fitbox(home, [smollm2.parent]) as box:
        tiers = {t["resource"]: t for t in httpx.get(f"{box.url}/v1/limits").json()["data"]}
        assert tiers["ram"]["device"] == psutil.virtual_memory().total
        assert tiers["ram"]["box"] is None and tiers["cores"]["effective"] >= 1
        too_big = post(box.url, "/v1/limits", {"ram_max": "1000TiB"})
        assert too_big.status_code == 400
        error = too_big.json()["error"]
        assert (
            error["code"] == "above_parent_tier"
            and "above what the device has" in (error["message"])
        )
        assert post(box.url, "/v1/limits", {"ram_max": "lots"}).json()["error"]["param"] == (
            "ram_max"
        )
        assert post(box.url, "/v1/limits", {"ram_max": "64MiB"}).status_code == 200
        refused = chat(box.url)
        assert refused.status_code == 507 and refused.json()["error"]["code"] == "does_not_fit"
    with running_fitbox(home, [smollm2.parent]) as box:  # kept in the store
        tiers = {t["resource"]: t for t in httpx.get(f"{box.url}/v1/limits").json()["data"]}
        assert tiers["ram"]["box"] == 64 << 20 and tiers["ram"]["effective"] == 64 << 20
        assert post(box.url, "/v1/limits", {"ram_max": None}).status_code == 200
        assert chat(box.url).status_code == 200
        actions = [
            r["action"]
            for r in httpx.get(
                f"{box.url}/v1/telemetry", params={"table": "operator_actions"}
            ).json()["rows"]
        ]
        assert actions.count("limits") == 2


def test_settings_box_and_pair_change_what_the_next_call_gets(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    with running_fitbox(tmp_path / "home", [smollm2.parent]) as box:
        view = post(box.url, "/v1/settings/box", {"window": 1024}).json()
        assert view["own"] == {"window": 1024} and view["effective"]["window"] == 1024
        assert view["default"]["window"] == 4096
        assert chat(box.url).status_code == 200
        (resident,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
        assert resident["window"] == 1024
        # a model limited to a rung this box cannot give is refused with the reason
        pair = post(box.url, "/v1/settings/pair", {"model": "smollm2", "rungs": ["gpu-only"]})
        assert pair.status_code == 200
        body = pair.json()
        assert body["own"] == {"rungs": ["gpu-only"]} and body["box"]["window"] == 1024
        assert body["effective"]["rungs"] == ["gpu-only"]
        httpx.post(f"{box.url}/v1/operator/unload", json={"model": "smollm2"}, timeout=30)
        refused = chat(box.url)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "no_candidate"
        for bad, param in (
            ({"model": "smollm2", "goal": "cheap"}, "goal"),
            ({"model": "smollm2", "colour": "red"}, "colour"),
            ({"goal": "fast"}, "model"),
        ):
            response = post(box.url, "/v1/settings/pair", bad)
            assert response.status_code == 400 and response.json()["error"]["param"] == param
        assert post(
            box.url, "/v1/settings/pair", {"model": "nope", "goal": "fast"}
        ).status_code == (404)
        post(box.url, "/v1/settings/pair", {"model": "smollm2", "rungs": None})
        listed = httpx.get(f"{box.url}/v1/settings/pair").json()["data"]
        assert listed == []  # clearing the last knob drops the model's row
        assert chat(box.url).status_code == 200


def test_verdicts_price_every_rung_and_cores_show_the_claim(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    env = {"FITBOX_SIMULATED_GPUS": "100MiB"}
    with running_fitbox(tmp_path / "home", [smollm2.parent], env=env) as box:
        data = httpx.get(f"{box.url}/v1/verdicts", params={"model": "smollm2"}).json()["data"]
        (entry,) = data
        auto = entry["auto"]
        assert (auto["decision"], auto["rung"]) == ("place", "ram-only")
        by = {(v["rung"], v["kv"]): v for v in entry["verdicts"]}
        assert by[("gpu-only", "f16/f16")]["reason"] == "larger_than_box"
        assert by[("ram-only", "f16/f16")]["admissible"] is True
        assert by[("ram-only", "f16/f16")]["band"]["max"] == 4096
        q8 = by[("ram-only", "q8_0/q8_0")]
        assert (
            q8["admissible"]
            and q8["devices"]["host"]["bytes"]
            < (by[("ram-only", "f16/f16")]["devices"]["host"]["bytes"])
        )  # a smaller cache
        assert by[("moe-split", "f16/f16")]["reason"] == "not_moe"
        every = httpx.get(f"{box.url}/v1/verdicts").json()["data"]
        assert [e["model"] for e in every] == [SMOL] and "verdicts" not in every[0]
        assert chat(box.url).status_code == 200
        cores = httpx.get(f"{box.url}/v1/cores").json()
        claimed = [c for c in cores["data"] if c["claimed_by"] == SMOL]
        assert claimed and all(c["role"] == "claimed" for c in claimed)
        if cores["physical"] >= 2:  # the reserved core is lent only once the box reads quiet
            first = cores["data"][0]  # (box/sensors.py settled): lent exactly when claimed
            assert first["lent"] is (first["claimed_by"] == SMOL), first
            assert first["claimed_by"] == SMOL or first["role"] == "fitbox and the OS"


def test_idle_ttl_unloads_and_a_pin_is_loaded_again_after_a_restart(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    home = tmp_path / "home"
    with running_fitbox(home, [smollm2.parent]) as box:
        post(box.url, "/v1/settings/pair", {"model": "smollm2", "idle_ttl": 1})
        assert chat(box.url).status_code == 200
        until(
            lambda: not httpx.get(f"{box.url}/v1/residents").json()["data"],
            "unloaded after its idle TTL",
        )
        assert "idle past its TTL" in box.log()
        post(box.url, "/v1/settings/pair", {"model": "smollm2", "idle_ttl": None})
        assert (
            httpx.post(
                f"{box.url}/v1/operator/pin", json={"model": "smollm2"}, timeout=60
            ).status_code
            == 200
        )
    with running_fitbox(home, [smollm2.parent]) as box:
        residents = until(
            lambda: (
                (found := httpx.get(f"{box.url}/v1/residents").json()["data"])
                and found[0]["state"] == "ready"
                and found
            ),
            "the pinned model loaded at start",
        )
        assert residents[0]["pinned"] is True


def test_a_model_loaded_below_its_window_grows_back_when_room_lasts(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    from fitbox.core import sizing
    from fitbox.models.gguf_facts import read_facts

    shape = read_facts(smollm2).shape
    tight = sizing.footprint(shape, 1024, 1).total + (1 << 20)  # room for 1024, not 4096
    env = {"FITBOX_GROW_COOLDOWN": "1"}
    with running_fitbox(
        tmp_path / "home", [smollm2.parent], "--ram-max", str(tight), env=env
    ) as box:
        assert chat(box.url).status_code == 200
        (small,) = httpx.get(f"{box.url}/v1/residents").json()["data"]
        assert small["window"] == 1024  # the band gave what fits
        assert post(box.url, "/v1/limits", {"ram_max": "4GiB"}).status_code == 200  # room
        until(
            lambda: (
                (found := httpx.get(f"{box.url}/v1/residents").json()["data"])
                and found[0]["window"] == 4096
                and found[0]["state"] == "ready"
            ),
            "grown back to a 4096 window",
        )
        assert "room for a 4096-token window has lasted" in box.log()
        assert chat(box.url).status_code == 200


def test_a_lowered_ram_cap_evicts_an_idle_resident_and_waits_for_a_serving_one(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """A cap lowered below what is held: a serving resident is never stopped for it, the
    box says so in /health until it fits, and the resident leaves once its call ends."""
    with running_fitbox(tmp_path / "home", [smollm2.parent]) as box:
        assert chat(box.url).status_code == 200
        with engine_stopped(box, SMOL):  # its engine frozen: the call stays in flight
            held = Background(lambda: chat(box.url))
            until(lambda: calls_on(box, SMOL) == 1 or None, "the call on the resident")
            assert post(box.url, "/v1/limits", {"ram_max": "64MiB"}).status_code == 200
            health = until(
                lambda: (h := httpx.get(f"{box.url}/health").json())["problems"] and h,
                "the cap named in /health",
            )
            (problem,) = health["problems"]
            assert health["status"] == "degraded" and problem.startswith("host: the residents")
            assert "64.00 MiB cap (ram_max)" in problem and f"{SMOL} (ready, 1 call(s))" in problem
            assert calls_on(box, SMOL) == 1  # still there: it serves
        assert held.result().status_code == 200  # the call finished whole
        until(lambda: not httpx.get(f"{box.url}/v1/residents").json()["data"], "the eviction")
        assert httpx.get(f"{box.url}/health").json()["problems"] == []
        rows = httpx.get(f"{box.url}/v1/telemetry", params={"table": "evictions"}).json()["rows"]
        assert [r["reason"] for r in rows] == ["cap_lowered"]

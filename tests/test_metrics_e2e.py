"""/metrics on a real fitbox serving SmolLM2 on the real engine: parsed with
prometheus_client's own parser, scraped by the real Prometheus server with a read key, and
refused to the outside without one.

fitbox listens on 127.0.0.2; a client bound to 127.0.0.3 is not the box itself."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import fitbox

from .support.holds import engine_stopped, until
from .support.paths import REPO
from .support.processes import FitboxProcess, running_fitbox
from .support.tools import required_tool

pytestmark = pytest.mark.engine
SERVER, CLIENT = "127.0.0.2", "127.0.0.3"
SMOL = "SmolLM2-135M-Instruct.Q4_1"  # its file stem: the name the catalog lists
FAMILIES = {
    "fitbox_calls",
    "fitbox_call_errors",
    "fitbox_prompt_tokens",
    "fitbox_completion_tokens",
    "fitbox_call_queue_seconds",
    "fitbox_call_load_seconds",
    "fitbox_call_ttft_seconds",
    "fitbox_call_total_seconds",
    "fitbox_loads",
    "fitbox_evictions",
    "fitbox_refusals",
    "fitbox_load_estimate_error_ratio",
    "fitbox_device_capacity_bytes",
    "fitbox_device_free_bytes",
    "fitbox_device_held_bytes",
    "fitbox_device_reserved_bytes",
    "fitbox_residents",
    "fitbox_queue_length",
    "fitbox_store_write_failures",
    "fitbox_store_changes",
    "fitbox_build_info",
    "fitbox_child_scrape_failures",
    "process_start_time_seconds",
    "process_cpu_seconds",
}


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[FitboxProcess]:
    home = tmp_path_factory.mktemp("metrics") / "home"
    with running_fitbox(
        home, [smollm2.parent], "--host", SERVER, env={"FITBOX_SIMULATED_GPUS": "2GiB"}
    ) as running:
        yield running


@pytest.fixture(scope="module")
def read_key(box: FitboxProcess) -> str:
    made = httpx.post(f"{box.url}/v1/keys", json={"name": "scraper", "scopes": ["read"]})
    assert made.status_code == 201, made.text
    key: str = made.json()["key"]
    return key


def scrape(box: FitboxProcess) -> dict[str, Any]:
    reply = httpx.get(f"{box.url}/metrics", timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(reply.text)}


def samples(
    families: dict[str, Any], name: str, sample: str | None = None, **labels: str
) -> list[Any]:
    return [
        s
        for s in families[name].samples
        if (sample is None or s.name == sample)
        and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def scrape_until(box: FitboxProcess, name: str, what: str, **labels: str) -> dict[str, Any]:
    """A scrape once it shows a sample of ``name`` (rows land a moment after the reply)."""

    def showing() -> dict[str, Any] | None:
        families = scrape(box)
        return families if samples(families, name, **labels) else None

    return until(showing, what)


def chat(box: FitboxProcess, **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{box.url}/v1/chat/completions",
        json={
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 4,
            **extra,
        },
        timeout=120,
    )


def limits(box: FitboxProcess, ram: str | None, vram: str | None) -> None:
    reply = httpx.post(f"{box.url}/v1/limits", json={"ram_max": ram, "vram_max": vram})
    assert reply.status_code == 200, reply.text


def test_every_family_after_one_call_with_the_childs_own(box: FitboxProcess) -> None:
    # limits smaller than the model: the placement refuses the call, with its reason
    limits(box, "64MiB", "64MiB")
    refused = chat(box)
    limits(box, None, None)
    assert refused.status_code == 507, refused.text
    refused_code = refused.json()["error"]["code"]
    assert chat(box).status_code == 200
    missing = httpx.post(
        f"{box.url}/v1/chat/completions",
        json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
    )
    assert missing.status_code == 404
    families = scrape_until(box, "fitbox_call_errors", "the refusal counted", code=refused_code)
    assert set(families) >= FAMILIES, FAMILIES - set(families)
    (ok,) = samples(families, "fitbox_calls", "fitbox_calls_total", model=SMOL, outcome="ok")
    assert ok.value == 1
    (not_found,) = samples(families, "fitbox_call_errors", code="model_not_found", model="")
    assert not_found.value == 1
    # refused before it had an artifact: named by the alias it asked for
    (refusal,) = samples(families, "fitbox_refusals", reason="larger_than_box")
    assert refusal.value == 1 and refusal.labels["model"] == SMOL
    (tokens,) = samples(
        families, "fitbox_completion_tokens", "fitbox_completion_tokens_total", model=SMOL
    )
    assert 1 <= tokens.value <= 4
    # the answered call waited on the load: one load observation; the refused one and it
    # both have a total, only the answered one was admitted (a queue time)
    (load,) = samples(families, "fitbox_call_load_seconds", "fitbox_call_load_seconds_count")
    assert load.value == 1
    (load_sum,) = samples(families, "fitbox_call_load_seconds", "fitbox_call_load_seconds_sum")
    assert 0 < load_sum.value < 120
    (total,) = samples(
        families, "fitbox_call_total_seconds", "fitbox_call_total_seconds_count", model=SMOL
    )
    assert total.value == 2
    (queue,) = samples(
        families, "fitbox_call_queue_seconds", "fitbox_call_queue_seconds_count", model=SMOL
    )
    assert queue.value == 1
    assert samples(families, "fitbox_loads", "fitbox_loads_total")[0].value == 1
    # the load was measured: its estimate error is observed, from file-header estimates
    (errors,) = samples(
        families,
        "fitbox_load_estimate_error_ratio",
        "fitbox_load_estimate_error_ratio_count",
        basis="estimate",
    )
    assert errors.value == 1
    # the devices: the simulated GPU is labelled, the host is not
    gpu = samples(families, "fitbox_device_capacity_bytes", device="gpu0", simulated="true")
    host = samples(families, "fitbox_device_capacity_bytes", device="host", simulated="false")
    assert gpu and host and gpu[0].value > 0
    held = sum(s.value for s in families["fitbox_device_held_bytes"].samples)
    assert held > 50 * 2**20  # SmolLM2's weights and cache are somewhere
    assert samples(families, "fitbox_residents", state="ready")[0].value == 1
    # the child's own figures, with the model they are about
    child = [name for name in families if name.startswith("llamacpp_")]
    assert child, sorted(families)
    for name in child:
        for sample in families[name].samples:
            assert sample.labels["model"] == SMOL
    assert samples(families, "fitbox_store_changes")[0].value > 0
    (build,) = samples(families, "fitbox_build_info")
    assert build.labels["version"] == fitbox.__version__


def test_a_child_that_does_not_answer_is_left_out(box: FitboxProcess) -> None:
    assert chat(box).status_code == 200
    with engine_stopped(box, SMOL):  # SIGSTOP: it cannot answer its /metrics
        families = scrape(box)
    assert not [name for name in families if name.startswith("llamacpp_")]
    (failed,) = samples(families, "fitbox_child_scrape_failures", model=SMOL)
    assert failed.value >= 1
    assert samples(families, "fitbox_residents", state="ready")  # the box's own are there
    assert any(n.startswith("llamacpp_") for n in scrape(box))  # and back once it answers


def test_an_eviction_is_counted_by_reason(box: FitboxProcess) -> None:
    assert chat(box).status_code == 200
    unloaded = httpx.post(f"{box.url}/v1/operator/unload", json={"model": "smollm2"}, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    families = scrape_until(box, "fitbox_evictions", "the eviction counted")
    (evicted,) = samples(families, "fitbox_evictions", "fitbox_evictions_total")
    assert evicted.labels["reason"] == "operator"
    assert evicted.labels["model"] == SMOL


def test_outside_needs_a_read_key(box: FitboxProcess, read_key: str) -> None:
    outside = httpx.HTTPTransport(local_address=CLIENT)
    with httpx.Client(transport=outside, timeout=30) as client:
        refused = client.get(f"{box.url}/metrics")
        assert refused.status_code == 401
        error = refused.json()["error"]
        assert error["type"] == "authentication_error" and "read key" in error["message"]
        allowed = client.get(f"{box.url}/metrics", headers={"Authorization": f"Bearer {read_key}"})
        assert allowed.status_code == 200
        assert "fitbox_calls_total" in allowed.text or "fitbox_calls " in allowed.text
    made = httpx.post(f"{box.url}/v1/keys", json={"name": "app", "scopes": ["inference"]})
    inference_key = made.json()["key"]
    with httpx.Client(transport=httpx.HTTPTransport(local_address=CLIENT), timeout=30) as client:
        denied = client.get(
            f"{box.url}/metrics", headers={"Authorization": f"Bearer {inference_key}"}
        )
        assert denied.status_code == 403
        assert denied.json()["error"]["type"] == "permission_error"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def prometheus(tmp: Path, target: str, key: str) -> Iterator[str]:
    binary = required_tool("prometheus", "prometheus")
    (tmp / "key").write_text(key)
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: fitbox\n"
        f"    authorization: {{type: Bearer, credentials_file: {tmp / 'key'}}}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = _free_port()
    with (tmp / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_scraped_by_the_real_prometheus(box: FitboxProcess, read_key: str, tmp_path: Path) -> None:
    assert chat(box).status_code == 200
    target = box.url.removeprefix("http://")

    def query(url: str, expr: str) -> list[dict[str, Any]] | None:
        try:
            reply = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
        except httpx.HTTPError:
            return None  # not listening yet
        found: list[dict[str, Any]] = reply.json()["data"]["result"] if reply.is_success else []
        return found or None

    with prometheus(tmp_path, target, read_key) as url:
        up = until(lambda: query(url, 'up{job="fitbox"} == 1'), "Prometheus scraped fitbox")
        assert up[0]["metric"]["instance"] == target
        calls = until(lambda: query(url, 'fitbox_calls_total{outcome="ok"}'), "the calls")
        assert float(calls[0]["value"][1]) >= 1
        devices = until(lambda: query(url, "fitbox_device_capacity_bytes"), "the devices")
        assert {d["metric"]["device"] for d in devices} >= {"gpu0", "host"}
        until(lambda: query(url, "llamacpp_requests_processing"), "the child's own")
        # every query of the shipped Grafana dashboard is one Prometheus accepts, and each
        # names families fitbox (or its child) exports
        exported = set(scrape(box))
        for expr, title in dashboard_queries():
            reply = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
            assert reply.json()["status"] == "success", (title, expr, reply.text)
            named = {
                re.sub(r"_(total|bucket|sum|count)$", "", name)
                for name in re.findall(r"\b((?:fitbox|llamacpp)_[a-z_]+)", expr)
            }
            assert named <= exported, (title, named - exported)


def dashboard_queries() -> list[tuple[str, str]]:
    """Each panel's queries with Grafana's variables as a viewer's first look sets them."""
    dashboard = json.loads((REPO / "packaging" / "grafana" / "fitbox.json").read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "1m")
            expr = expr.replace("$model", ".*").replace("$instance", ".*")
            found.append((expr, panel["title"]))
    assert len(found) >= 20
    return found


def test_the_page_passes_promtool_with_no_created_twins(box: FitboxProcess) -> None:
    """Prometheus' own linter over the whole page with a child's figures in it: no colons
    in a name (the child's ``llamacpp:*`` re-exported as ``llamacpp_*``), no type in a name,
    counters ending ``_total``, and no ``*_created`` twin beside each counter."""
    assert chat(box).status_code == 200
    text = httpx.get(f"{box.url}/metrics", timeout=30).text
    assert "llamacpp_" in text and "llamacpp:" not in text
    assert not [line for line in text.splitlines() if "_created" in line.split(" ")[0]]
    promtool = required_tool("promtool", "prometheus")
    checked = subprocess.run(
        [str(promtool), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")

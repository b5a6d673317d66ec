"""Files and folders fitbox may not read are data: listed with why, refused with why, and a
model already loaded from one serves on. fitbox runs bound by file modes
(tests/support/unprivileged.py: root without its read override), so mode 0000 refuses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fitbox import config
from fitbox.models.catalog import Catalog

from .support.clients import app_client
from .support.ggufs import write_tiny_llama
from .support.processes import FitboxProcess, running_fitbox
from .support.unprivileged import without_read_override

pytestmark = pytest.mark.engine
HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture
def models(tmp_path: Path) -> Iterator[Path]:
    """``tiny`` (readable), ``locked`` (a GGUF of mode 0000) and ``private/`` (a folder of
    mode 0000 holding ``hidden``); the modes are put back so the test's files can go."""
    root = tmp_path / "models"
    (root / "private").mkdir(parents=True)
    write_tiny_llama(root / "tiny.gguf")
    write_tiny_llama(root / "locked.gguf")
    write_tiny_llama(root / "private" / "hidden.gguf")
    (root / "locked.gguf").chmod(0)
    (root / "private").chmod(0)
    try:
        yield root
    finally:
        for path in (root, root / "private", root / "locked.gguf"):
            path.chmod(0o755)


@pytest.fixture
def box(tmp_path: Path, models: Path, llama_server_bin: Path) -> Iterator[FitboxProcess]:
    with running_fitbox(tmp_path / "home", [models], wrap=without_read_override()) as box:
        yield box


def _chat(box: FitboxProcess, model: str) -> httpx.Response:
    body = {"model": model, "messages": HELLO, "max_tokens": 2}
    return httpx.post(f"{box.url}/v1/chat/completions", json=body, timeout=120)


def _listed(box: FitboxProcess) -> dict[str, Any]:
    answer = httpx.get(f"{box.url}/v1/models", timeout=30)
    assert answer.status_code == 200, answer.text
    listed: dict[str, Any] = answer.json()
    return listed


def test_unreadable_files_are_listed_and_refused_with_why(box: FitboxProcess, models: Path) -> None:
    listed = _listed(box)
    assert [m["id"] for m in listed["data"]] == ["tiny", "fitbox-helper"]
    reasons = {bad["path"]: bad for bad in listed["not_servable"]}
    locked = reasons[str(models / "locked.gguf")]
    assert locked["name"] == "locked"
    assert "Permission denied" in locked["reason"] and "(0000)" in locked["reason"]
    assert "owner root (uid 0)" in locked["reason"]
    assert str(models / "private") in reasons
    health = httpx.get(f"{box.url}/health", timeout=30).json()
    assert health["status"] == "degraded"
    assert any(str(models / "locked.gguf") in p for p in health["problems"])
    assert any(str(models / "private") in p for p in health["problems"])
    refused = _chat(box, "locked")
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "model_unreadable" and error["param"] == "model"
    assert "(0000)" in error["message"] and refused.headers["x-should-retry"] == "false"
    missing = _chat(box, "hidden")  # in a folder fitbox cannot list: not seen, and why
    assert missing.status_code == 404
    assert f"fitbox cannot read {models / 'private'}" in missing.json()["error"]["message"]


def test_an_outsider_is_told_what_but_not_the_paths(box: FitboxProcess, models: Path) -> None:
    """An inference key is not the operator: the refusal, the listing and /health say a file
    cannot be read, without the box's paths, owners and modes."""
    made = httpx.post(
        f"{box.url}/v1/keys", json={"name": "app", "scopes": ["inference"]}, timeout=30
    )
    assert made.status_code in (200, 201), made.text
    key = {"authorization": f"Bearer {made.json()['key']}"}
    body = {"model": "locked", "messages": HELLO, "max_tokens": 2}
    refused = httpx.post(f"{box.url}/v1/chat/completions", json=body, headers=key, timeout=120)
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "model_unreadable" and "operator_reason" not in error
    assert "shown to the box itself and to admin keys" in error["message"]
    listed = httpx.get(f"{box.url}/v1/models", headers=key, timeout=30)
    health = httpx.get(f"{box.url}/health", headers=key, timeout=30)
    unknown = {"model": "nope", "messages": HELLO, "max_tokens": 2}
    missing = httpx.post(f"{box.url}/v1/chat/completions", json=unknown, headers=key, timeout=60)
    assert missing.status_code == 404 and "Known models: tiny." in missing.text, missing.text
    for answer in (refused, listed, missing):
        assert str(models) not in answer.text and "(0000)" not in answer.text, answer.text
    assert {bad["name"] for bad in listed.json()["not_servable"]} == {"locked"}
    assert health.json()["status"] == "degraded"  # on the box itself: insider, with paths


def test_health_tells_the_network_a_count_and_the_box_itself_the_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models").mkdir()
    reason = "fitbox cannot read the folder /srv/secret-models: Permission denied"
    monkeypatch.setattr(Catalog, "unreadable_now", lambda self: [reason])
    cfg = config.load({"home": str(tmp_path), "models": str(tmp_path / "models")}, env={})
    with app_client(cfg, ("203.0.113.5", 5000)) as outside:
        far = outside.get("/health").json()
    with app_client(cfg) as local:
        near = local.get("/health").json()
    assert far["status"] == near["status"] == "degraded"
    assert "/srv/secret-models" not in json.dumps(far) and "cannot read 1 " in far["problems"][0]
    assert reason in near["problems"]


def test_a_loaded_model_serves_on_when_its_folder_turns_unreadable(
    box: FitboxProcess, models: Path
) -> None:
    assert _chat(box, "tiny").status_code == 200  # loaded while readable
    models.chmod(0)
    health = httpx.get(f"{box.url}/health", timeout=30).json()  # before any rescan
    assert health["status"] == "degraded"
    assert any(str(models) in p for p in health["problems"])
    rescan = httpx.post(f"{box.url}/v1/operator/refresh-models", json={}, timeout=30)
    assert rescan.status_code == 200, rescan.text  # the folder refuses fitbox now
    listed = _listed(box)
    tiny = next(m for m in listed["data"] if m["id"] == "tiny")
    assert tiny["resident"] is True and "Permission denied" in tiny["problem"]
    assert str(models) in {bad["path"] for bad in listed["not_servable"]}
    served = _chat(box, "tiny")
    assert served.status_code == 200, served.text
    unloaded = httpx.post(f"{box.url}/v1/operator/unload", json={"model": "tiny"}, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    again = _chat(box, "tiny")  # no child holds it now: a load could not read it
    assert again.status_code == 503 and again.json()["error"]["code"] == "model_unreadable"
    load = httpx.post(f"{box.url}/v1/operator/load", json={"model": "tiny"}, timeout=60)
    assert load.status_code == 503 and "Permission denied" in load.json()["error"]["message"]


def test_fitbox_models_lists_what_it_cannot_read(tmp_path: Path, models: Path) -> None:
    argv = [sys.executable, "-m", "fitbox", "models", "--json", "--models", str(models)]
    env = {**os.environ, "FITBOX_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [*without_read_override(), *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    rows = {row["path"]: row for row in json.loads(done.stdout)}
    assert rows[str(models / "tiny.gguf")]["name"] == "tiny"
    locked = rows[str(models / "locked.gguf")]
    assert locked["name"] == "locked" and "(0000)" in locked["rejected"]
    assert "Permission denied" in rows[str(models / "private")]["rejected"]

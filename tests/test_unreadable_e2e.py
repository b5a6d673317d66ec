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
    assert [m["id"] for m in listed["data"]] == ["tiny"]
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

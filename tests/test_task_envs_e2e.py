"""A task runner whose environment is missing: the call that needs it starts its build off
the request path and is refused as data (503 engine_env_building, Retry-After); a build
that fails says why (503 engine_env_failed, `fitbox engines`) and is not started again by
later calls. The build is real (venv, pip); pip is pointed at an empty wheel folder and no
index, so it fails at once and offline."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fitbox.engines.task_envs import state_of
from fitbox.engines.task_runners import runner_named

from .support.clients import assert_error
from .support.processes import running_fitbox
from .support.task_engines import WHISPER, whisper_folder

WAIT_S = 600  # a venv with pip bootstrapped, on a busy 2-core box: a bound, never a figure


def test_a_missing_environment_builds_once_and_a_failed_build_says_why(tmp_path: Path) -> None:
    root, engines, wheels = tmp_path / "models", tmp_path / "engines", tmp_path / "no-wheels"
    for folder in (root, engines, wheels):
        folder.mkdir()
    (root / WHISPER).symlink_to(whisper_folder())
    env = {
        "FITBOX_ENGINE_DIR": str(engines),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_CONFIG_FILE": "/dev/null",
    }
    spec = runner_named("faster-whisper")
    with running_fitbox(tmp_path / "home", [root], env=env) as box:
        url = f"{box.url}/v1/audio/transcriptions"
        form, upload = {"model": WHISPER}, {"file": ("a.wav", b"RIFF" + b"\0" * 64)}
        first = httpx.post(url, data=form, files=upload, timeout=60)
        error = assert_error(first, 503, "engine_env_building")
        assert "faster-whisper" in str(error["message"]) and first.headers["retry-after"]
        deadline = time.monotonic() + WAIT_S
        while state_of(engines, spec).state in ("missing", "building"):
            assert time.monotonic() < deadline, "the build never ended"
            time.sleep(0.5)
        failed = state_of(engines, spec)
        assert failed.state == "failed" and "faster-whisper" in failed.reason, failed
        log = engines / f"{spec.name}.build.log"
        built_at = log.stat().st_mtime_ns
        for _ in range(2):
            again = httpx.post(url, data=form, files=upload, timeout=60)
            said = assert_error(again, 503, "engine_env_failed")
            assert "fitbox install --tasks" in str(said["message"])
            assert "No matching distribution" in str(said["message"])
        assert log.stat().st_mtime_ns == built_at  # not built again
        assert state_of(engines, spec).state == "failed"
        assert not list(engines.glob(f"{spec.name}.building-*"))
        listed = subprocess.run(
            [sys.executable, "-m", "fitbox", "engines"],
            capture_output=True,
            text=True,
            env={**os.environ, "FITBOX_ENGINE_DIR": str(engines), "FITBOX_HOME": str(box.home)},
            timeout=120,
            check=False,
        )
        assert f"{spec.name} ({spec.format}) {engines / spec.name}  failed:" in listed.stdout
        codes = [r["error_code"] for r in box.calls() if r["endpoint"].startswith("/v1/audio")]
        assert codes == ["engine_env_building", "engine_env_failed", "engine_env_failed"]

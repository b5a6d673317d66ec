"""Load a model once in a real llama-server, only to read what it allocates, then stop it.

Used by the estimate-accuracy harness (tests and bench/estimate_accuracy.py); the same
measurement fitbox takes from every child it launches for real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fitbox.engines.child import free_port
from fitbox.engines.load_log import LoadReport, parse_load_log


@dataclass(frozen=True)
class LoadSpec:
    window: int
    parallel: int
    unified: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = True
    repack: bool = True
    mmproj: Path | None = None  # a vision projector loaded beside the model

    def argv(self) -> list[str]:
        args = [
            "-c",
            str(self.window),
            "-np",
            str(self.parallel),
            "-ctk",
            self.type_k,
            "-ctv",
            self.type_v,
            "-fa",
            "on" if self.flash_attn else "off",
            "-ngl",
            "0",
            "--fit",
            "off",
            "--verbosity",
            "4",
            "--no-webui",
        ]
        args += [] if self.repack else ["--no-repack"]
        args += ["--mmproj", str(self.mmproj)] if self.mmproj else []
        return [*args, "-kvu"] if self.unified else args

    def label(self) -> str:
        flags = (" kvu" if self.unified else "") + ("" if self.flash_attn else " fa-off")
        flags += ("" if self.repack else " no-repack") + (" mmproj" if self.mmproj else "")
        return f"c{self.window} np{self.parallel}{flags} {self.type_k}/{self.type_v}"


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def measure_load(binary: Path, model: Path, spec: LoadSpec, limit_s: float = 60) -> LoadReport:
    """Start, wait for /health, stop; parse everything it printed."""
    port = free_port()
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *spec.argv()]
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a full pipe would stall it
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + limit_s
            while proc.poll() is None and not _healthy(port) and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.seek(0)
        return parse_load_log(log.read().decode("utf-8", "replace"))

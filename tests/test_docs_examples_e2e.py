"""Every shell and Python example of the user guide, run against a real box: one
``fitbox serve`` on SmolLM2 for the whole module, its address put in place of the guide's
``http://127.0.0.1:8484``, the ``fitbox`` command of this interpreter on ``PATH`` with the
box's home and model root in the environment. A shell example fails on a non-zero exit, and
``curl`` fails on an HTTP error (``--fail-with-body``); a Python example on any exception.
An example marked "not run by the tests: WHY" is checked to say why on the page."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support.doc_examples import ADDRESS, NOT_RUN, Example, examples
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
EXAMPLES = examples()
# curl as the guide writes it, failing on an HTTP error as a reader would notice one
STRICT_CURL = 'curl() { command curl --fail-with-body --max-time 60 "$@"; }\n'


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[FitboxProcess]:
    home = tmp_path_factory.mktemp("docs-box") / "home"
    with running_fitbox(home, [smollm2.parent]) as running:
        yield running


def _env(box: FitboxProcess) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "FITBOX_HOME": str(box.home),
        "FITBOX_MODELS": os.pathsep.join(str(p) for p in _roots(box)),
    }


def _roots(box: FitboxProcess) -> list[str]:
    argv = box.proc.args
    assert isinstance(argv, list)
    return [str(argv[i + 1]) for i, arg in enumerate(argv) if arg == "--models"]


def test_the_guide_has_examples_and_every_one_left_out_says_why() -> None:
    assert len([e for e in EXAMPLES if e.runs]) >= 20
    for example in EXAMPLES:
        if not example.runs:
            assert len(example.title) > len(NOT_RUN) + 5, example.id


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.runs], ids=lambda e: e.id)
def test_example(example: Example, box: FitboxProcess, tmp_path: Path) -> None:
    code = example.code.replace(ADDRESS, box.url)
    if example.lang == "sh":
        argv = ["bash", "-euo", "pipefail", "-c", STRICT_CURL + code]
    else:
        argv = [sys.executable, "-c", code]
    ran = subprocess.run(
        argv, cwd=tmp_path, env=_env(box), capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, (
        f"{example.id} exited {ran.returncode}:\n{code}\n--- out\n{ran.stdout[-3000:]}"
        f"\n--- err\n{ran.stderr[-3000:]}"
    )

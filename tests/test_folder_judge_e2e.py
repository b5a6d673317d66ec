"""Folders judged before they are served, end to end: a real fitbox, a real llama-server
resident (SmolLM2's GGUF), real transformers children in the engine's own venv.

Each broken folder (tests/support/broken_folders.py) is listed as not servable with its
reason (GET /v1/models, ``fitbox models``), and a call naming it gets that reason as an
OpenAI-shaped error: nothing is loaded for it, and the resident's process is the same
one before and after (its pid). A task the files rule out (chat to an embedding model or a
reranker, embeddings from a chat model) is refused the same way, on either engine. Weights
whose NaN the scan's sample misses fail at run time as an engine error: never as JSON
holding a literal NaN.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support import broken_folders as broken
from .support.ggufs import write_tiny_llama
from .support.processes import FitboxProcess, running_fitbox
from .support.tf_engine import engine_env

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"  # the GGUF: the resident every refusal must leave alone
MINILM = "all-MiniLM-L6-v2"
SMOL_TF = "SmolLM2-135M-Instruct-f32"
HELLO = [{"role": "user", "content": "Say hi."}]
# each broken folder, and a phrase of the reason it is listed and refused with
BROKEN = {
    "no-tokenizer": "it has no tokenizer",
    "nan-sampled": "holds NaN or infinity",
    "truncated": "run past the end of the file",
    "unknown-arch": "architecture FrobnicatorForCausalLM is unknown to transformers",
    "remote-code": "needs its own Python code",
}


@dataclass
class Judged:
    box: FitboxProcess
    root: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def judged(
    tmp_path_factory: pytest.TempPathFactory,
    tf_python: Path,
    smol_tf: Path,
    minilm_tf: Path,
    smollm2: Path,
) -> Iterator[Judged]:
    tmp = tmp_path_factory.mktemp("judge")
    root = tmp / "models"
    root.mkdir()
    for model in (smollm2, smol_tf, minilm_tf):
        (root / model.name).symlink_to(model)
    tiny = broken.tiny_tf_folder(tf_python, smol_tf)
    for name, make in {
        "no-tokenizer": broken.no_tokenizer,
        "nan-sampled": broken.nan_sampled,
        "truncated": broken.truncated,
        "unknown-arch": broken.unknown_architecture,
        "remote-code": broken.remote_code,
        "nan-deep": broken.nan_deep,
    }.items():
        make(tiny, root / name)
    write_tiny_llama(root / "tiny-chat.gguf")
    write_tiny_llama(root / "tiny-rank.gguf", arch="qwen3", reranker=True)
    home = tmp / "home"
    env = engine_env(tf_python, tmp) | {"FITBOX_HOME": str(home), "FITBOX_MODELS": str(root)}
    # what the engine's transformers loads is recorded by its probe (here `fitbox engines`;
    # a serving box's own probe writes it too): the scan judges architectures by it
    fitbox(env, "engines")
    assert (home / "tf-capabilities.json").is_file()
    with running_fitbox(home, [root], env=env) as box:
        yield Judged(box, root, env)


def fitbox(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fitbox", *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def resident_pids(box: FitboxProcess) -> dict[str, tuple[int, str]]:
    """Each resident's pid and state, by model (the box itself is an insider)."""
    data = httpx.get(f"{box.url}/v1/residents", timeout=30).json()["data"]
    return {r["model"]: (r["pid"], r["state"]) for r in data}


def strict(text: str) -> Any:
    """JSON as a strict parser reads it: a bare NaN or Infinity is refused."""

    def refuse(name: str) -> None:
        raise AssertionError(f"the body holds a bare {name}: {text[:300]}")

    return json.loads(text, parse_constant=refuse)


def call(box: FitboxProcess, path: str, model: str, **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": model, **extra}
    if path.endswith("/chat/completions"):
        body = {"messages": HELLO, "max_tokens": 4, **body}
    else:
        body = {"input": "a cat", **body}
    return httpx.post(f"{box.url}{path}", json=body, timeout=600)


@pytest.fixture(scope="module")
def resident(judged: Judged) -> tuple[int, str]:
    """SmolLM2's GGUF loaded by a call: the resident the refusals must not touch."""
    loaded = call(judged.box, "/v1/chat/completions", SMOL)
    assert loaded.status_code == 200, loaded.text
    before = resident_pids(judged.box)
    assert before[SMOL][1] == "ready"
    return before[SMOL]


def test_each_broken_folder_is_listed_with_its_reason(judged: Judged) -> None:
    listed = httpx.get(f"{judged.box.url}/v1/models", timeout=60).json()
    served = {m["id"] for m in listed["data"]}
    reasons = {bad["name"]: bad["reason"] for bad in listed["not_servable"]}
    for name, why in BROKEN.items():
        assert name not in served and why in reasons[name], (name, reasons.get(name))
    assert {"nan-deep", SMOL_TF, MINILM} <= served  # the sample misses its NaN: run time
    rows = json.loads(fitbox(judged.env, "models", "--json"))
    rejected = {r["name"]: r["rejected"] for r in rows if "rejected" in r}
    for name, why in BROKEN.items():
        assert why in rejected[name], (name, rejected.get(name))


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_call_to_a_broken_folder_gets_its_reason_and_the_resident_is_untouched(
    judged: Judged, resident: tuple[int, str], name: str
) -> None:
    for path in ("/v1/chat/completions", "/v1/embeddings"):
        refused = call(judged.box, path, name)
        assert refused.status_code == 503, refused.text
        error = strict(refused.text)["error"]
        assert error["code"] == "model_not_servable" and error["param"] == "model"
        assert BROKEN[name] in error["message"]  # the box itself reads the whole reason
        assert "does not exist" not in error["message"]
    assert resident_pids(judged.box) == {SMOL: resident}  # nothing loaded, nothing left
    assert not any(p.name.startswith(name) for p in (judged.box.home / "logs").iterdir())


@pytest.mark.parametrize(
    ("path", "model", "code"),
    [
        ("/v1/chat/completions", MINILM, "not_a_chat_model"),  # transformers
        ("/v1/chat/completions", "tiny-rank", "not_a_chat_model"),  # llama-server
        ("/v1/embeddings", SMOL_TF, "not_an_embeddings_model"),  # transformers
        ("/v1/embeddings", "tiny-chat", "not_an_embeddings_model"),  # llama-server
    ],
)
def test_a_task_mismatch_is_refused_before_anything_loads_or_leaves(
    judged: Judged, resident: tuple[int, str], path: str, model: str, code: str
) -> None:
    refused = call(judged.box, path, model)
    assert refused.status_code == 400, refused.text
    error = strict(refused.text)["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error"
    assert f"'{model}'" in error["message"]
    assert resident_pids(judged.box) == {SMOL: resident}


def test_nan_weights_the_scan_missed_fail_as_an_engine_error_never_as_json_nan(
    judged: Judged,
) -> None:
    box = judged.box
    for stream in (False, True):
        failed = call(box, "/v1/chat/completions", "nan-deep", stream=stream, temperature=0)
        assert failed.status_code == 500, failed.text
        error = strict(failed.text)["error"]
        assert (
            error["code"] == "engine_failed" and "logits hold NaN or infinity" in (error["message"])
        )
    turned_on = httpx.post(
        f"{box.url}/v1/settings/pair",
        json={"model": "nan-deep", "embeddings": True},
        timeout=30,
    )
    assert turned_on.status_code == 200, turned_on.text
    vectors = call(box, "/v1/embeddings", "nan-deep")  # loaded again as an embedder
    assert vectors.status_code == 500, vectors.text
    error = strict(vectors.text)["error"]
    assert error["code"] == "engine_failed" and "vectors hold NaN or infinity" in error["message"]
    rows = [r for r in box.calls() if r["model_asked"] == "nan-deep"]
    assert [r["outcome"] for r in rows] != [] and all(r["outcome"] != "ok" for r in rows)


def test_a_box_whose_engine_was_never_probed_judges_by_its_own_probe(
    tmp_path: Path, tf_python: Path, smol_tf: Path
) -> None:
    """No `fitbox engines` ran: the first call to a folder of an unknown architecture waits
    for the engine's probe (as its load would) and gets the reason, with no load; the
    probe's record is left for the next scan."""
    root = tmp_path / "models"
    broken.unknown_architecture(broken.tiny_tf_folder(tf_python, smol_tf), root / "unknown-arch")
    with running_fitbox(tmp_path / "home", [root], env=engine_env(tf_python, tmp_path)) as box:
        refused = call(box, "/v1/chat/completions", "unknown-arch")
        assert refused.status_code == 503, refused.text
        assert BROKEN["unknown-arch"] in strict(refused.text)["error"]["message"]
        assert (tmp_path / "home" / "tf-capabilities.json").is_file()
        assert httpx.get(f"{box.url}/v1/residents", timeout=30).json()["data"] == []

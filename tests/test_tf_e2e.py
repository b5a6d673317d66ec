"""The transformers engine end to end: real fitbox, real children in the engine's own venv,
real weights (SmolLM2 rebuilt into a safetensors folder, all-MiniLM-L6-v2), the openai SDK.

One fitbox serves the module's calls; the engine-less one runs its own. A transformers
child's load is the module's slow part, so the tests are ordered to load SmolLM2 as few
times as they can (the child the faults restart serves the eviction, the adapter's base
answer and the measured-load test, which unloads it last); each test still loads what it
needs when run alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from openai.types.chat import ChatCompletionMessageParam

from .support.clients import openai_client
from .support.processes import FitboxProcess, running_fitbox
from .support.tf_engine import MINILM_DIM, adapted_folder, engine_env

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct-f32"
MINILM = "all-MiniLM-L6-v2"
IDLE_S = 3
HELLO: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"}
]


def models_root(root: Path, *folders: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        (root / folder.name).symlink_to(folder)
    return root


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory,
    tf_python: Path,
    smol_tf: Path,
    minilm_tf: Path,
    smollm2: Path,
) -> Iterator[FitboxProcess]:
    """One fitbox for the module: SmolLM2 as a folder, with a LoRA and with a broken one, as
    the GGUF, and MiniLM."""
    tmp = tmp_path_factory.mktemp("tf")
    root = models_root(tmp / "models", smol_tf, minilm_tf, smollm2)
    adapted_folder(smol_tf, root / "smol-lora")
    adapted_folder(smol_tf, root / "smol-broken", broken=True)
    # a short quiet bound for the hang test: a working child answers /health meanwhile
    env = engine_env(tf_python, tmp) | {
        "FITBOX_ENGINE_IDLE_TIMEOUT": str(IDLE_S),
        "FITBOX_STOP_GRACE": "1",
    }
    with running_fitbox(tmp / "home", [root], env=env) as running:
        yield running


def client_for(box: FitboxProcess) -> openai.OpenAI:
    return openai_client(box.url, timeout=300)


def test_chat_whole_and_streamed_give_the_same_greedy_answer(box: FitboxProcess) -> None:
    client = client_for(box)
    whole = client.chat.completions.create(model=SMOL, messages=HELLO, max_tokens=8, temperature=0)
    text = whole.choices[0].message.content
    assert text and "Paris" in text  # the real model, through its own chat template
    assert whole.usage is not None and whole.usage.completion_tokens <= 8
    stream = client.chat.completions.create(
        model=SMOL, messages=HELLO, max_tokens=8, temperature=0, stream=True
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == text and len([p for p in pieces if p]) > 1
    cut = client.chat.completions.create(
        model=SMOL, messages=HELLO, max_tokens=8, temperature=0, stop=["Paris"]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index("Paris")]
    rows = [r for r in box.calls() if r["model_asked"] == SMOL]
    assert [r["outcome"] for r in rows] == ["ok", "ok", "ok"]


def test_embeddings_have_the_models_dimension(box: FitboxProcess) -> None:
    client = client_for(box)
    reply = client.embeddings.create(model=MINILM, input=["a cat", "a dog", "tax law"])
    vectors = [d.embedding for d in reply.data]
    assert [len(v) for v in vectors] == [MINILM_DIM] * 3

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))  # normalised by the folder

    assert abs(cosine(vectors[0], vectors[0]) - 1) < 1e-3  # the Normalize module ran
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])


def test_a_chat_call_to_an_embedding_model_is_refused_with_a_reason(box: FitboxProcess) -> None:
    refused = httpx.post(
        f"{box.url}/v1/chat/completions", timeout=120, json={"model": MINILM, "messages": HELLO}
    )
    assert refused.status_code >= 400
    error = refused.json()["error"]
    assert set(error) >= {"message", "type", "code", "param"} and error["message"]


def test_an_image_for_a_text_model_and_an_http_image_are_refused_with_reasons(
    box: FitboxProcess,
) -> None:
    def ask(url: str) -> dict[str, str]:
        content = [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        reply = httpx.post(
            f"{box.url}/v1/chat/completions",
            timeout=120,
            json={"model": SMOL, "messages": [{"role": "user", "content": content}]},
        )
        assert reply.status_code == 400
        error: dict[str, str] = reply.json()["error"]
        return error

    assert ask("http://example.com/cat.png")["code"] == "image_url_not_fetched"
    blind = ask("data:image/png;base64,iVBORw0KGgo=")  # PNG's signature: an image, to fitbox
    assert blind["code"] == "model_not_vision_capable"
    assert "does not read images" in blind["message"]


def test_fitbox_engines_names_the_selected_interpreter(tf_python: Path, tmp_path: Path) -> None:
    env = {**os.environ, **engine_env(tf_python, tmp_path), "FITBOX_HOME": str(tmp_path / "home")}
    out = subprocess.run(
        [sys.executable, "-m", "fitbox", "engines"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    ).stdout
    line = next(ln for ln in out.splitlines() if str(tf_python) in ln)
    assert line.startswith("*") and "selected" in line
    imported = {ln.split()[0]: ln.split()[1] for ln in out.splitlines() if ln.startswith("    ")}
    for module in ("torch", "transformers", "sentence_transformers", "PIL", "bitsandbytes"):
        assert imported[module] == "ok", out  # each imported in the engine's interpreter
    support = json.loads((tmp_path / "home" / "tf-capabilities.json").read_text())
    assert "LlamaForCausalLM" in support["architectures"]
    missing = tmp_path / "home" / "engines" / "tf" / "bin" / "python"
    assert f"  {missing}  (engine dir (fitbox install --tf); not there" in out


def test_without_an_engine_a_call_fails_naming_the_command_that_fixes_it(
    tmp_path: Path, smol_tf: Path
) -> None:
    root = models_root(tmp_path / "models", smol_tf)
    env = engine_env(tmp_path / "no" / "python", tmp_path)
    with running_fitbox(tmp_path / "home", [root], env=env) as bare:
        failed = httpx.post(
            f"{bare.url}/v1/chat/completions", timeout=60, json={"model": SMOL, "messages": HELLO}
        )
        assert failed.status_code >= 500
        error = failed.json()["error"]
        assert error["code"] == "engine_failed" and error["type"]
        assert "fitbox install --tf" in error["message"] and "FITBOX_TF_PYTHON" in error["message"]


def signal_children_mid_stream(box: FitboxProcess, sig: signal.Signals) -> list[str]:
    """Stream a long reply; on its third event (the test's own event, so the signal lands
    mid-stream) send ``sig`` to every engine child. Returns the data events."""
    body = {
        "model": SMOL,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    events: list[str] = []
    with httpx.stream("POST", f"{box.url}/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3:
                    for child in psutil.Process(box.proc.pid).children(recursive=True):
                        os.kill(child.pid, sig)
    return events


def test_a_child_killed_mid_stream_ends_the_stream_with_an_error_and_loads_again(
    box: FitboxProcess,
) -> None:
    events = signal_children_mid_stream(box, signal.SIGKILL)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "engine_failed" and "failed mid-call" in error["message"]
    row = box.calls()[-1]
    assert (row["outcome"], row["error_code"]) == ("error", "engine_failed")
    again = client_for(box).chat.completions.create(model=SMOL, messages=HELLO, max_tokens=2)
    assert again.choices[0].message.content


def test_a_child_hung_mid_stream_ends_it_with_engine_timeout_and_is_restarted(
    box: FitboxProcess,
) -> None:
    """SIGSTOP hangs the real child on demand: no byte, no /health, no CPU."""
    events = signal_children_mid_stream(box, signal.SIGSTOP)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "engine_timeout"
    assert f"sent nothing for {IDLE_S} s and did not answer its health probe" in error["message"]
    row = box.calls()[-1]
    assert (row["outcome"], row["error_code"]) == ("error", "engine_timeout")
    again = client_for(box).chat.completions.create(model=SMOL, messages=HELLO, max_tokens=2)
    assert again.choices[0].message.content


def test_a_transformers_model_and_a_gguf_evict_each_other_by_memory(
    box: FitboxProcess, smollm2: Path
) -> None:
    """Both load once with room to measure them; then, the GGUF unloaded, a RAM cap that
    holds either one but not both makes each call evict the other, priced from the measured
    footprints (the transformers child loads twice: its loads are the slow part)."""
    gguf, client = smollm2.stem, client_for(box)
    for model in (SMOL, gguf):
        client.chat.completions.create(model=model, messages=HELLO, max_tokens=1)
    residents = httpx.get(f"{box.url}/v1/residents", timeout=30).json()["data"]
    sizes = {r["model"]: r["bytes"] for r in residents if r["model"] in (SMOL, gguf)}
    assert len(sizes) == 2 and all(r["basis"] == "measured" for r in residents)
    for model in {r["model"] for r in residents} - {SMOL}:
        httpx.post(f"{box.url}/v1/operator/unload", json={"model": model}, timeout=60)
    cap = max(sizes.values()) + min(sizes.values()) // 2
    limited = httpx.post(f"{box.url}/v1/limits", json={"ram_max": cap}, timeout=30)
    assert limited.status_code == 200, limited.text
    assert [m["id"] for m in box.models().values() if m["resident"]] == [SMOL]  # it fits
    try:
        for model in (gguf, SMOL):
            reply = client.chat.completions.create(model=model, messages=HELLO, max_tokens=2)
            assert reply.choices[0].message.content
            resident = [m for m in box.models().values() if m["resident"]]
            assert [m["id"] for m in resident] == [model]
    finally:
        httpx.post(f"{box.url}/v1/limits", json={"ram_max": None}, timeout=30)
    evicted = [json.loads(str(r["evicted"])) for r in box.calls() if r["evicted"]]
    assert [SMOL] in evicted and [gguf] in evicted


def test_an_adapter_changes_the_greedy_answer_and_a_broken_one_fails_the_launch(
    box: FitboxProcess,
) -> None:
    client = client_for(box)
    base = (
        client.chat.completions.create(model=SMOL, messages=HELLO, max_tokens=6, temperature=0)
        .choices[0]
        .message.content
    )
    listed = box.models()
    assert int(str(listed["smol-lora"]["size_bytes"])) > int(str(listed[SMOL]["size_bytes"]))
    adapted = client.chat.completions.create(
        model="smol-lora", messages=HELLO, max_tokens=6, temperature=0
    )
    assert adapted.choices[0].message.content != base
    broken = httpx.post(
        f"{box.url}/v1/chat/completions",
        timeout=300,
        json={"model": "smol-broken", "messages": HELLO},
    )
    assert broken.status_code >= 500
    error = broken.json()["error"]
    assert error["code"] == "engine_failed"
    assert "could not load 'smol-broken'" in error["message"]


def test_the_first_load_is_measured_and_priced_from_next_time(box: FitboxProcess) -> None:
    client_for(box).chat.completions.create(model=SMOL, messages=HELLO, max_tokens=1)
    residents = httpx.get(f"{box.url}/v1/residents", timeout=30).json()["data"]
    smol = next(r for r in residents if r["model"] == SMOL)
    assert smol["basis"] == "measured"
    header = sum((Path(smol["artifact"]) / "model.safetensors").stat().st_size for _ in [0])
    # counted weights: the tied embedding once, every tensor float32, within the file's size
    assert 0.9 * header < smol["footprint"]["weights"] <= header
    assert smol["footprint"]["kv"] > 0  # the window's budget, held as the cache grows
    # it holds its weights and compute part, and of its cache only what a call grew (let
    # go after each call): the room keeps the rest of its budget (box/growth.py)
    used = smol["footprint"]["weights"] + smol["footprint"]["compute"]
    assert used <= smol["held_now"] < smol["bytes"], smol
    unloaded = httpx.post(f"{box.url}/v1/operator/unload", json={"model": SMOL}, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    plan = httpx.get(f"{box.url}/v1/plan", params={"model": SMOL}, timeout=30).json()
    assert plan["basis"] == "measured", plan  # the next decision prices from the load
    assert plan["devices"][0]["weights_bytes"] == smol["footprint"]["weights"]


def test_install_tf_keeps_an_engine_built_from_the_same_requirements(
    tf_python: Path, tmp_path: Path
) -> None:
    """The tests' engine venv was built by the installer's code: `fitbox install --tf` on an
    engine dir holding it keeps it (a re-run is safe) and reports what it can do."""
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "tf").symlink_to(tf_python.parents[1])
    env = {**os.environ, "FITBOX_ENGINE_DIR": str(engines), "FITBOX_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "fitbox", "install", "--tf"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "kept" in done.stdout and "transformers engine ready" in done.stdout
    assert "4-bit: yes" in done.stdout  # bitsandbytes comes with the extra, CPU too
    support = json.loads((tmp_path / "tf-capabilities.json").read_text())
    assert "LlamaForCausalLM" in support["architectures"] and "llama" in support["model_types"]

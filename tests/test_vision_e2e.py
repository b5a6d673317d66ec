"""Images through the door, end to end: real fitbox, the openai SDK, real engines reading
real images. llama-server loads SmolLM2 with a random LLaVA-style projector written with
gguf beside it (``--mmproj``; tests/support/ggufs.py); the transformers child loads a tiny random
LLaVA folder built at test time (tests/support/tf_engine.py). The image reached the model when the
prompt grows by the image's tokens and two images give two greedy answers.

One fitbox serves the module; the refusals are decided before any model is placed.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from fitbox.core.prompts import prompt_bound
from fitbox.models.gguf_facts import read_facts
from fitbox.models.templates import chat_template_bytes
from fitbox.models.vision import image_tokens

from .support.clients import openai_client
from .support.ggufs import write_tiny_llama, write_vision_projector
from .support.images import RED, STRIPES, data_url, noise
from .support.processes import FitboxProcess, running_fitbox
from .support.tf_engine import TINY_LLAVA_IMAGE_TOKENS, engine_env, tiny_llava_folder

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
LLAVA = "tiny-llava"
TEXT = "text-only"
MAX_IMAGE = 64 << 10
# the projector's ViT: (64 / 8)^2 patches, each one image token in SmolLM2's prompt
PROJECTOR_IMAGE_TOKENS = (64 // 8) ** 2
BIG = noise(150, 80)  # ~36 KB of PNG: ~48K tokens by its base64 bytes


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, tf_python: Path, smol_tf: Path, smollm2: Path
) -> Iterator[FitboxProcess]:
    tmp = tmp_path_factory.mktemp("vision")
    eyes = tmp / "models" / "smol-vision"
    eyes.mkdir(parents=True)
    (eyes / smollm2.name).symlink_to(smollm2)
    write_vision_projector(eyes / "mmproj-smol.gguf", n_embd_text=576)
    (tmp / "models" / LLAVA).symlink_to(tiny_llava_folder(tf_python, smol_tf))
    write_tiny_llama(tmp / "models" / f"{TEXT}.gguf")
    env = engine_env(tf_python, tmp) | {"FITBOX_MAX_IMAGE": str(MAX_IMAGE)}
    with running_fitbox(tmp / "home", [tmp / "models"], env=env) as running:
        yield running


def question(*images: bytes) -> dict[str, Any]:
    parts: list[Any] = [{"type": "text", "text": "What is in the picture?"}]
    parts += [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 6, "temperature": 0}


def ask(box: FitboxProcess, model: str, *images: bytes) -> tuple[int, str]:
    """(prompt tokens, greedy answer) of one question about ``images``."""
    client = openai_client(box.url, timeout=300)
    reply = client.chat.completions.create(model=model, **question(*images))
    assert reply.usage is not None
    return reply.usage.prompt_tokens, reply.choices[0].message.content or ""


def test_the_models_list_says_which_models_read_images(box: FitboxProcess) -> None:
    models = box.models()
    assert {m: models[m]["vision"] for m in (SMOL, LLAVA, TEXT)} == {
        SMOL: True,
        LLAVA: True,
        TEXT: False,
    }
    assert "mmproj-smol" not in models  # the projector is the model's eyes, not a model


def test_llama_server_reads_an_image_through_the_projector_beside_its_gguf(
    box: FitboxProcess,
) -> None:
    text_only, _ = ask(box, SMOL)
    red_n, red = ask(box, SMOL, RED)
    stripes_n, stripes = ask(box, SMOL, STRIPES)
    assert red_n == stripes_n == text_only + PROJECTOR_IMAGE_TOKENS
    assert red != stripes  # the pixels reached the model
    resident = next(
        r
        for r in httpx.get(f"{box.url}/v1/residents", timeout=10).json()["data"]
        if r["model"] == SMOL
    )
    argv = psutil.Process(resident["pid"]).cmdline()
    assert argv[argv.index("--mmproj") + 1].endswith("mmproj-smol.gguf")
    assert "--no-mmproj-offload" in argv  # placed in RAM, and kept there
    mmproj = Path(argv[argv.index("--mmproj") + 1])
    projector = read_facts(mmproj).projector
    assert projector is not None
    # the prompt bound a cold placement uses: never below the engine's count, an image
    # counted as the projector's tokens, not as its ~35K base64 bytes
    big_n, _ = ask(box, SMOL, BIG, STRIPES)
    assert big_n == text_only + 2 * PROJECTOR_IMAGE_TOKENS
    template = chat_template_bytes(Path(argv[argv.index("-m") + 1]))
    bound = prompt_bound(question(BIG, STRIPES), template, image_tokens(mmproj, projector))
    assert big_n <= bound < prompt_bound(question(BIG, STRIPES), template) / 10
    text_weights = read_facts(Path(argv[argv.index("-m") + 1])).shape.weights_bytes
    # the measured load counts the projector's buffer with the weights (its load log)
    assert resident["basis"] == "measured"
    beyond_text = resident["footprint"]["weights"] - text_weights
    assert abs(beyond_text - projector.weights_bytes) <= 0.02 * projector.weights_bytes


def test_the_transformers_child_reads_an_image_through_the_folders_processor(
    box: FitboxProcess,
    tf_python: Path,
    smol_tf: Path,
) -> None:
    text_only, _ = ask(box, LLAVA)
    red_n, red = ask(box, LLAVA, RED)
    both_n, _ = ask(box, LLAVA, RED, STRIPES)
    stripes_n, stripes = ask(box, LLAVA, STRIPES)
    assert red_n == stripes_n == text_only + TINY_LLAVA_IMAGE_TOKENS
    assert both_n == text_only + 2 * TINY_LLAVA_IMAGE_TOKENS
    # the folder's processor bounds each image: never below the child's count
    folder = tiny_llava_folder(tf_python, smol_tf)
    bound = prompt_bound(question(RED, STRIPES), 0, image_tokens(folder, None))
    assert both_n <= bound < prompt_bound(question(RED, STRIPES), 0)
    assert red != stripes
    client = openai_client(box.url, timeout=300)
    stream = client.chat.completions.create(
        model=LLAVA,
        max_tokens=6,
        temperature=0,
        stream=True,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in the picture?"},
                    {"type": "image_url", "image_url": {"url": data_url(RED)}},
                ],
            }
        ],
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == red


def refusal(
    box: FitboxProcess, model: str, url: str, path: str = "/v1/chat/completions"
) -> dict[str, Any]:
    body: dict[str, Any]
    if path == "/v1/responses":
        body = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]}
    elif path == "/v1/messages":
        body = {
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": url}}],
                }
            ],
        }
    else:
        body = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                }
            ]
        }
    reply = httpx.post(f"{box.url}{path}", timeout=60, json={"model": model, **body})
    assert reply.status_code == 400, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == ("input" if path == "/v1/responses" else "messages")
    return error


@contextlib.contextmanager
def recording_server() -> Iterator[tuple[str, list[str]]]:
    """An http image URL on loopback, and every path anyone asked it for."""
    asked: list[str] = []

    class Recording(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(RED)))
            self.end_headers()
            self.wfile.write(RED)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/red.png", asked
    finally:
        server.shutdown()
        server.server_close()


def test_images_fitbox_will_not_pass_on_are_refused_before_a_model_is_placed(
    box: FitboxProcess,
) -> None:
    before = {r["model"] for r in httpx.get(f"{box.url}/v1/residents", timeout=10).json()["data"]}
    with recording_server() as (url, asked):  # llama-server itself would fetch these
        for path in ("/v1/chat/completions", "/apply-template", "/v1/responses", "/v1/messages"):
            fetched = refusal(box, SMOL, url, path)
            assert fetched["code"] == "image_url_not_fetched" and "data URL" in fetched["message"]
    assert asked == []
    big = noise(160, 160)
    assert len(big) > MAX_IMAGE
    large = refusal(box, SMOL, data_url(big))
    assert large["code"] == "image_too_large" and "FITBOX_MAX_IMAGE" in large["message"]
    blind = refusal(box, TEXT, data_url(RED))
    assert blind["code"] == "model_not_vision_capable" and TEXT in blind["message"]
    after = {r["model"] for r in httpx.get(f"{box.url}/v1/residents", timeout=10).json()["data"]}
    assert TEXT not in after and after <= before | {SMOL, LLAVA}
    rows = box.calls()[-6:]
    assert [r["outcome"] for r in rows] == ["error"] * 6  # each refused call has its row

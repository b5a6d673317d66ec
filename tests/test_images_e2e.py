"""Images end to end: a real fitbox, the real diffusers runner in its own environment on the
tiny random Stable Diffusion the tests build (tests/support/diffusers_engine.py, no network),
and the openai SDK. Keys are required (FITBOX_REQUIRE_KEYS), so the image URLs are shown to
sit behind the same key check as the call that made them."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from .support.clients import make_key, openai_client
from .support.diffusers_engine import diffusers_python, tiny_pipeline
from .support.png import decode
from .support.processes import FitboxProcess, running_fitbox
from .support.task_engines import engine_dir

MODEL = "tiny-sd"
FAST = {"steps": 2}  # two denoising steps: a random pipeline draws noise either way


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FitboxProcess]:
    tmp = tmp_path_factory.mktemp("images")
    root = tmp / "models"
    root.mkdir()
    (root / MODEL).symlink_to(tiny_pipeline(diffusers_python()))
    home = tmp / "home"
    engine_dir(home / "engines")  # the runners' environments, built once per cache
    env = {"FITBOX_REQUIRE_KEYS": "true", "HOME": str(tmp)}
    with running_fitbox(home, [root], env=env) as running:
        running.headers = {"Authorization": f"Bearer {make_key(home, 'inference')}"}
        yield running


@pytest.fixture(scope="module")
def client(box: FitboxProcess) -> Iterator[openai.OpenAI]:
    key = box.headers["Authorization"].removeprefix("Bearer ")
    with openai_client(box.url, key, timeout=300, max_retries=0) as made:
        yield made


def image_rows(box: FitboxProcess) -> list[dict[str, Any]]:
    return [r for r in box.calls() if r["endpoint"] == "/v1/images/generations"]


def test_the_catalog_lists_a_diffusers_folder_as_an_image_model(box: FitboxProcess) -> None:
    listed = box.models()[MODEL]
    assert listed.get("task") == "image", listed


def test_pngs_decode_at_the_size_asked_and_their_sha256_is_on_the_call_row(
    box: FitboxProcess, client: openai.OpenAI
) -> None:
    made = client.images.generate(
        model=MODEL,
        prompt="a red cat",
        size="64x32",
        n=2,
        response_format="b64_json",
        extra_body={"seed": 3, **FAST},
    )
    assert made.data is not None and len(made.data) == 2
    pngs = [base64.b64decode(item.b64_json or "") for item in made.data]
    for png in pngs:
        image = decode(png)
        assert (image.width, image.height) == (64, 32)
        assert image.distinct_pixels() > 1
    row = image_rows(box)[-1]
    assert row["outcome"] == "ok"
    outputs = [f for f in json.loads(row["files"]) if f["role"] == "output"]
    assert [(f["bytes"], f["sha256"]) for f in outputs] == [
        (len(png), hashlib.sha256(png).hexdigest()) for png in pngs
    ]
    assert row["image_pixels"] == 2 * 64 * 32
    # the runner's timings count images: the speed book holds ms an image for the queue's ETA
    assert row["completion_tokens"] == 2 and row["decode_per_token_ms"] > 0
    prompt = next(f for f in json.loads(row["files"]) if f["role"] == "input")
    assert prompt["sha256"] == hashlib.sha256(b"a red cat").hexdigest()
    # the same seed makes the same files again
    again = client.images.generate(
        model=MODEL,
        prompt="a red cat",
        size="64x32",
        n=2,
        extra_body={"seed": 3, **FAST},
    )
    assert [base64.b64decode(i.b64_json or "") for i in again.data or []] == pngs


def test_a_url_fetches_the_image_with_the_calls_key_and_expires(
    box: FitboxProcess, client: openai.OpenAI
) -> None:
    made = client.images.generate(
        model=MODEL, prompt="a boat", response_format="url", extra_body=FAST
    )
    assert made.data is not None and len(made.data) == 1
    url = made.data[0].url or ""
    assert url.startswith(f"{box.url}/v1/images/files/image-")
    fetched = httpx.get(url, headers=box.headers, timeout=30)
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
    image = decode(fetched.content)
    assert (image.width, image.height) == (64, 64)  # auto: the model's native square
    row = image_rows(box)[-1]
    output = next(f for f in json.loads(row["files"]) if f["role"] == "output")
    assert output["sha256"] == hashlib.sha256(fetched.content).hexdigest()
    assert url.rsplit("/", 1)[1] not in row["files"]  # the URL's name is not on the row
    keyless = httpx.get(url, timeout=30)
    assert keyless.status_code == 401, keyless.text
    # older than FITBOX_ARTIFACT_MAX_AGE (an hour): gone, though no prune has run since
    kept = box.home / "artifacts" / url.rsplit("/", 1)[1]
    hours_ago = kept.stat().st_mtime - 3601
    os.utime(kept, (hours_ago, hours_ago))
    expired = httpx.get(url, headers=box.headers, timeout=30)
    assert expired.status_code == 404
    assert expired.json()["error"]["code"] == "image_expired"
    guessed = httpx.get(f"{box.url}/v1/images/files/call-1.json", headers=box.headers)
    assert guessed.status_code == 404  # another call's output is no image URL


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"prompt": "  "}, "prompt", "empty_prompt"),
        ({"prompt": "a cat", "size": "60x64"}, "size", "invalid_size"),
        ({"prompt": "a cat", "size": "1024x1024"}, "size", "invalid_size"),
        ({"prompt": "a cat", "n": 0}, "n", "invalid_value"),
        ({"prompt": "a cat", "n": 11}, "n", "invalid_value"),
        ({"prompt": "a cat", "response_format": "png"}, "response_format", None),
        ({"prompt": "a cat", "quality": "hd"}, "quality", "unsupported_field"),
    ],
)
def test_bad_input_is_a_clear_openai_error_naming_the_field(
    client: openai.OpenAI, fields: dict[str, Any], param: str, code: str | None
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.post(
            "/images/generations",
            body={"model": MODEL, **fields},
            cast_to=httpx.Response,
        )
    error = raised.value.body
    assert isinstance(error, dict)
    assert error.get("param") == param, error
    assert error.get("type") == "invalid_request_error"
    assert code is None or error.get("code") == code
    assert error.get("message")

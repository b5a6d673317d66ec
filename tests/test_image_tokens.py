"""Images in the prompt bound (core/image_tokens.py, core/image_header.py, the image term of
core/prompts.py, models/vision.py image_tokens, box/needs.py): each image counts as the
tokens its projector or processor makes of it. The bound against the real engines' counts
is tests/test_vision_e2e.py."""

from __future__ import annotations

import json
import logging
import math
import struct
from pathlib import Path
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from fitbox.box.needs import Needs
from fitbox.core.image_header import image_dims
from fitbox.core.image_tokens import (
    QWEN_TOKENS,
    ImageTokens,
    processor_image_tokens,
    projector_image_tokens,
    resized_tokens,
)
from fitbox.core.projector import ProjectorShape
from fitbox.core.prompts import prompt_bound
from fitbox.models.catalog import Artifact
from fitbox.models.gguf_facts import read_facts
from fitbox.models.vision import image_tokens

from .support.ggufs import write_tiny_llama, write_vision_projector
from .support.images import STRIPES, data_url, noise


def shape(kind: str, image_size: int = 64, patch_size: int = 8, **more: Any) -> ProjectorShape:
    return ProjectorShape(
        weights_bytes=1,
        projector_type=kind,
        image_size=image_size,
        patch_size=patch_size,
        n_embd=8,
        n_ff=8,
        n_layer=1,
        **more,
    )


def chat(*urls: str) -> dict[str, Any]:
    parts: list[Any] = [{"type": "text", "text": "What is in the picture?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"messages": [{"role": "user", "content": parts}]}


def test_a_fixed_resolution_projector_counts_each_image_as_its_tiles_tokens() -> None:
    llava = projector_image_tokens(shape("mlp"))
    assert llava == ImageTokens(fixed=64)  # (64 / 8)^2 patches, the class token dropped
    assert projector_image_tokens(shape("ldp", 336, 14)) == ImageTokens(fixed=576 // 4 + 2)
    gemma = projector_image_tokens(shape("gemma3", 896, 14))
    assert gemma is not None and gemma.bound(None) == 256 + len("<start_of_image><end_of_image>")
    assert projector_image_tokens(shape("gemma3", 896, 14, n_merge=2)) == ImageTokens(
        fixed=1024, extra=len("<start_of_image><end_of_image>")
    )
    # LLaVA-1.6 slices an image by its grid; a kind not covered has no count
    assert projector_image_tokens(shape("mlp", pinpoints=True)) is None
    assert projector_image_tokens(shape("resampler")) is None


def test_an_image_in_the_bound_is_its_tokens_not_its_bytes() -> None:
    big, small = data_url(noise(96, 96)), data_url(STRIPES)
    text = prompt_bound(chat(), 100)
    by_bytes = prompt_bound(chat(big, small), 100)
    assert by_bytes > text + len(big) + len(small) - 100  # the old bound: base64 as tokens
    bounded = prompt_bound(chat(big, small), 100, ImageTokens(fixed=64))
    parts = len(json.dumps({"type": "image_url", "image_url": {"url": ""}})) + 2  # ", "
    assert bounded == text + 2 * (parts + 64)
    # an unknown count keeps the bytes; so does a dynamic kind without the image's size
    assert prompt_bound(chat(big, small), 100, None) == by_bytes
    assert prompt_bound(
        chat("data:image/png;base64,AAAA"), 100, ImageTokens(side=28, max_pixels=4096 * 28 * 28)
    ) == prompt_bound(chat("data:image/png;base64,AAAA"), 100)


def test_the_responses_and_messages_shapes_count_their_images_too() -> None:
    url = data_url(noise(64, 64))
    responses = {
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]
    }
    payload = url.partition(",")[2]
    messages = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": payload},
                    }
                ],
            }
        ]
    }
    for body, held in ((responses, url), (messages, payload)):
        assert (
            prompt_bound(body, 100, ImageTokens(fixed=10))
            == prompt_bound(body, 100) - len(held) + 10
        )


def test_a_dynamic_resolution_model_counts_an_image_by_the_size_its_header_gives() -> None:
    qwen = projector_image_tokens(shape("qwen2vl_merger", 560, 14))
    wrap = len("<|vision_start|><|vision_end|>")
    assert qwen is not None and qwen.side == 28
    assert qwen.bound(None) is None
    assert qwen.bound((1000, 500)) == 36 * 18 + wrap  # kept at its rounded size
    assert qwen.bound((10, 10)) == resized_tokens((10, 10), 28, 8 * 784, 4096 * 784) + wrap
    assert 8 <= resized_tokens((10, 10), 28, 8 * 784, 4096 * 784) <= 3 * 3  # scaled up
    huge = resized_tokens((8000, 6000), 28, 8 * 784, 4096 * 784)
    assert QWEN_TOKENS[1] * 0.95 <= huge <= QWEN_TOKENS[1]  # scaled down into the budget
    png = noise(70, 40)
    assert (
        prompt_bound(chat(data_url(png)), 100, qwen)
        == prompt_bound(chat(""), 100) + resized_tokens((70, 40), 28, 8 * 784, 4096 * 784) + wrap
    )


def smart_resize(
    width: int, height: int, side: int, low: int, high: int, half_even: bool
) -> tuple[int, int]:
    """transformers' qwen2_vl smart_resize (half_even: Python's round) and mtmd-image.cpp
    calc_size_preserved_ratio (half away from zero), as tokens across and down."""

    def near(x: float) -> int:
        return round(x) if half_even else math.floor(x + 0.5)

    h_bar, w_bar = max(side, near(height / side) * side), max(side, near(width / side) * side)
    if h_bar * w_bar > high:
        beta = math.sqrt(height * width / high)
        h_bar = max(side, math.floor(height / beta / side) * side)
        w_bar = max(side, math.floor(width / beta / side) * side)
    elif h_bar * w_bar < low:
        beta = math.sqrt(low / (height * width))
        h_bar, w_bar = math.ceil(height * beta / side) * side, math.ceil(width * beta / side) * side
    return w_bar // side, h_bar // side


@given(st.integers(1, 9000), st.integers(1, 9000), st.sampled_from([28, 32]))
def test_the_dynamic_bound_is_never_below_either_resize(width: int, height: int, side: int) -> None:
    low, high = 8 * side * side, 4096 * side * side
    bound = resized_tokens((width, height), side, low, high)
    for half_even in (False, True):
        across, down = smart_resize(width, height, side, low, high, half_even)
        # never below; at most a token more a side (a float32 product may round either way)
        assert across * down <= bound <= (across + 1) * (down + 1)


def jpeg(width: int, height: int) -> bytes:
    app0 = b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x22\x00" * 3
    return (
        b"\xff\xd8"
        + b"\xff\xe0"
        + struct.pack(">H", len(app0) + 2)
        + app0
        + b"\xff\xff"
        + b"\xff\xc2"
        + struct.pack(">H", len(sof) + 2)
        + sof
        + b"\xff\xda"
    )


def riff(chunk: bytes, body: bytes) -> bytes:
    data = chunk + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", len(data) + 4) + b"WEBP" + data


def test_an_images_size_is_read_from_its_header_alone() -> None:
    assert image_dims(noise(70, 40)) == (70, 40)
    assert image_dims(b"GIF89a" + struct.pack("<HH", 300, 200) + b"\x00" * 4) == (300, 200)
    assert image_dims(jpeg(640, 480)) == (640, 480)  # after an APP0 and fill bytes
    vp8 = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", 123, 45)
    assert image_dims(riff(b"VP8 ", vp8)) == (123, 45)
    vp8l = b"\x2f" + struct.pack("<I", (123 - 1) | ((45 - 1) << 14))
    assert image_dims(riff(b"VP8L", vp8l)) == (123, 45)
    vp8x = b"\x00" * 4 + (5000 - 1).to_bytes(3, "little") + (3000 - 1).to_bytes(3, "little")
    assert image_dims(riff(b"VP8X", vp8x)) == (5000, 3000)
    # truncated or not an image: no size, never an exception
    for broken in (noise(8, 8)[:20], jpeg(8, 8)[:30], b"\xff\xd8\xff\xda", b"BM", b""):
        assert image_dims(broken) is None


def test_a_folders_processor_says_how_many_tokens_an_image_becomes(tmp_path: Path) -> None:
    llava = {
        "processor_class": "LlavaProcessor",
        "patch_size": 14,
        "num_additional_image_tokens": 1,
        "image_processor": {"crop_size": {"height": 336, "width": 336}, "do_center_crop": True},
    }
    (tmp_path / "processor_config.json").write_text(json.dumps(llava))
    assert image_tokens(tmp_path, None) == ImageTokens(fixed=577)  # ≥ 576: one spare
    qwen = {"patch_size": 14, "merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056}
    assert processor_image_tokens("Qwen2VLProcessor", {}, qwen) == ImageTokens(
        side=28, min_pixels=3136, max_pixels=12845056, extra=8
    )
    gemma = {"image_seq_length": 256}
    assert processor_image_tokens("Gemma3Processor", gemma, {}) == ImageTokens(256, extra=8)
    assert processor_image_tokens("Gemma3Processor", gemma, {"do_pan_and_scan": True}) is None
    assert processor_image_tokens("LlavaNextProcessor", llava, {}) is None
    assert image_tokens(tmp_path / "absent", None) is None


def test_a_model_whose_images_fitbox_cannot_count_bounds_them_by_their_bytes_and_says_so(
    tmp_path: Path,
    caplog: Any,
) -> None:
    model = write_tiny_llama(tmp_path / "eyes.gguf")
    counted = write_vision_projector(tmp_path / "mmproj-eyes.gguf", n_embd_text=64)
    known = read_facts(counted).projector
    assert known is not None
    unknown = ProjectorShape(**{**known.__dict__, "projector_type": "resampler"})
    needs = Needs(1, cast(Any, None), cast(Any, None))
    seeing = Artifact("eyes", model, read_facts(model), mmproj=counted, projector=known)
    odd = Artifact("odd-eyes", model, read_facts(model), mmproj=counted, projector=unknown)
    body = chat(data_url(noise(96, 96)))
    with caplog.at_level(logging.INFO, logger="fitbox.box.needs"):
        assert needs.bounded(body, 100, [seeing]) == prompt_bound(body, 100, ImageTokens(64))
        assert not caplog.records
        assert needs.bounded(body, 100, [odd]) == prompt_bound(body, 100)
        needs.bounded(body, 100, [odd])  # said once a model, not once a call
        # a family of both is bounded for the one that may take the most
        assert needs.bounded(body, 100, [seeing, odd]) == prompt_bound(body, 100)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "odd-eyes" in lines[0] and "'resampler'" in lines[0] and "bytes" in lines[0]

"""The diffusers runner called directly in its own environment, on the tiny random pipeline
(tests/support/diffusers_engine.py): the PNGs it makes decode at the size asked, a seed
makes them again byte for byte, what it holds is what its files hold, and a size, a seed
or a prompt it cannot honour is refused naming the field."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from fitbox.engines.task_child.diffusers import rule_from_folder
from fitbox.models.safetensors_header import read_safetensors_header

from .support.diffusers_engine import diffusers_python, drive_runner, tiny_pipeline
from .support.png import decode

CALLS: list[dict[str, object]] = [
    {"prompt": "a red cat", "size": "64x32", "n": 2, "seed": 3, "steps": 2},
    {"prompt": "a red cat", "size": "64x32", "n": 2, "seed": 3, "steps": 2},
    {"prompt": "a red cat", "size": "64x32", "n": 1, "seed": 4, "steps": 2},
    {"prompt": "a red cat", "size": "auto", "n": 1, "steps": 2},
    {"prompt": "a red cat", "size": "60x64", "steps": 2},
    {"prompt": "a red cat", "size": "256x256", "steps": 2},
    {"prompt": "a red cat", "size": "large", "steps": 2},
    {"prompt": "  ", "size": "64x64", "steps": 2},
]


@pytest.fixture(scope="module")
def folder() -> Path:
    return tiny_pipeline(diffusers_python())


@pytest.fixture(scope="module")
def driven(folder: Path) -> tuple[dict[str, object], list[dict[str, object]]]:
    return drive_runner(diffusers_python(), folder, CALLS)


def pngs(answer: dict[str, object]) -> list[bytes]:
    listed = answer["pngs"]
    assert isinstance(listed, list), answer
    return [base64.b64decode(p) for p in listed]


def test_the_pngs_decode_at_the_size_asked_and_a_seed_makes_them_again(
    driven: tuple[dict[str, object], list[dict[str, object]]],
) -> None:
    _, answers = driven
    first, again, other, native = (pngs(a) for a in answers[:4])
    assert len(first) == 2 and len(other) == 1
    for png in first + other:
        image = decode(png)
        assert (image.width, image.height) == (64, 32)
        assert image.distinct_pixels() > 1  # a picture, not a blank the decoder misread
    assert first == again  # the same seed, size and steps: the same files
    assert first[0] != first[1]  # n pictures of one call are n different pictures
    assert other[0] != first[0]
    assert (decode(native[0]).width, decode(native[0]).height) == (64, 64)


def test_what_it_holds_is_what_its_files_hold(
    driven: tuple[dict[str, object], list[dict[str, object]]], folder: Path
) -> None:
    loaded, _ = driven
    files = sum(read_safetensors_header(f).data_bytes for f in folder.rglob("*.safetensors"))
    # every weight as the files hold it (float32 on a CPU), plus the one buffer CLIP's text
    # encoder makes at load and never saves: its position ids (16 positions, int64)
    assert loaded["held"] == files + 16 * 8
    assert loaded["by_device"] == {"cpu": loaded["held"]}
    assert loaded["seeds"] is True


def test_the_sizes_it_reports_are_the_ones_read_from_its_files(
    driven: tuple[dict[str, object], list[dict[str, object]]], folder: Path
) -> None:
    loaded, _ = driven
    # the VAE's two blocks scale by 2, the UNet's latents are 32: 64 px native, up to 128,
    # and each side a multiple of 8 as every Stable Diffusion pipeline asks
    expected = {"multiple": 8, "native": 64, "largest": 128}
    assert loaded["sizes"] == loaded["from_folder"] == expected
    assert rule_from_folder(folder).as_json() == expected


def test_a_size_or_prompt_it_cannot_honour_is_refused_naming_the_field(
    driven: tuple[dict[str, object], list[dict[str, object]]],
) -> None:
    _, answers = driven
    not_multiple, too_large, not_a_size, empty = answers[4:]
    assert not_multiple["param"] == "size"
    assert "60x64" in str(not_multiple["message"]) and "multiple of 8" in str(
        not_multiple["message"]
    )
    assert too_large["param"] == "size" and "to 128" in str(too_large["message"])
    assert not_a_size["param"] == "size" and "WIDTHxHEIGHT" in str(not_a_size["message"])
    assert empty["param"] == "prompt"

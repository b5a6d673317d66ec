"""The parts of an image call that need no engine: a diffusers folder in the catalog, the
sizes it can make read from its files, and the artifact dir's unguessable, expiring names
(the runner's module is stdlib where these run)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from fitbox.engines.task_child.diffusers import SizeRule, rule_from_folder
from fitbox.engines.task_child.replies import BadRequest
from fitbox.models.catalog import scan
from fitbox.models.task_models import DIFFUSERS, FORMATS
from fitbox.server.door.artifacts import Artifacts


def pipeline(folder: Path, vae_blocks: int = 4, sample_size: object = 64) -> Path:
    """A Stable Diffusion folder's files as diffusers saves them (the weights are bytes)."""
    index = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DCondition"]}
    parts = {
        "unet": {"sample_size": sample_size},
        "vae": {"block_out_channels": [128] * vae_blocks},
        "text_encoder": {"architectures": ["CLIPTextModel"], "hidden_size": 8},
    }
    folder.mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps(index))
    for part, config in parts.items():
        (folder / part).mkdir()
        (folder / part / "config.json").write_text(json.dumps(config))
        (folder / part / "model.safetensors").write_bytes(b"w" * 1000)
    return folder


def test_a_diffusers_folder_is_one_image_model_and_its_parts_are_not_models(
    tmp_path: Path,
) -> None:
    folder = pipeline(tmp_path / "sd-tiny")
    found, rejected = scan([tmp_path])
    assert [a.name for a in found] == ["sd-tiny"] and rejected == []
    artifact = found[0]
    assert (artifact.format, artifact.task) == (DIFFUSERS, "image")
    assert artifact.facts.architecture == "StableDiffusionPipeline"
    files = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert artifact.facts.shape.weights_bytes == files + FORMATS[DIFFUSERS].runner_bytes


def test_a_folder_whose_index_is_not_json_is_refused_with_the_reason(tmp_path: Path) -> None:
    (pipeline(tmp_path / "broken") / "model_index.json").write_text("{not json")
    found, rejected = scan([tmp_path])
    assert found == [] and len(rejected) == 1
    assert "model_index.json is not JSON" in rejected[0].reason


def test_the_sizes_come_from_the_vae_scale_and_the_unets_latent_side(tmp_path: Path) -> None:
    sd15 = rule_from_folder(pipeline(tmp_path / "sd15"))  # 4 VAE blocks: 8 px a latent
    assert sd15 == SizeRule(multiple=8, native=512, largest=1024)
    pair = rule_from_folder(pipeline(tmp_path / "pair", sample_size=[96, 128]))
    assert pair.native == 1024  # its larger latent side
    assert sd15.parse("auto") == sd15.parse(None) == (512, 512)
    assert sd15.parse("768x512") == (768, 512)
    for bad, says in [
        ("500x512", "multiple of 8"),
        ("1032x512", "from 8 to 1024"),
        ("0x512", "from 8 to 1024"),
        ("big", "WIDTHxHEIGHT"),
        ("512x", "WIDTHxHEIGHT"),
        (512, "WIDTHxHEIGHT"),
    ]:
        with pytest.raises(BadRequest) as refused:
            sd15.parse(bad)
        assert (refused.value.param, refused.value.code) == ("size", "invalid_size")
        assert says in str(refused.value), (bad, str(refused.value))


def test_an_image_is_kept_under_an_unguessable_name_until_its_age(tmp_path: Path) -> None:
    artifacts = Artifacts(tmp_path, max_age=60, max_bytes=10**6)
    first, second = artifacts.unguessable("png"), artifacts.unguessable("png")
    for output in (first, second):
        output.write(b"\x89PNG")
        output.close()
    assert re.fullmatch(r"image-[0-9a-f]{32}\.png", first.name) and first.name != second.name
    kept = artifacts.path_of(first.name)
    assert kept is not None and kept.read_bytes() == b"\x89PNG"
    mtime = kept.stat().st_mtime
    assert artifacts.path_of(first.name, now=mtime + 59) == kept
    assert artifacts.path_of(first.name, now=mtime + 61) is None  # past its age: gone
    assert not kept.exists()
    assert artifacts.path_of("../" + second.name) is None  # only a name in the dir
    os.utime(tmp_path / second.name, (mtime, mtime))
    assert artifacts.path_of(second.name, now=mtime) is not None

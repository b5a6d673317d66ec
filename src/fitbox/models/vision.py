"""Which models read images: a vision-language transformers folder, or a GGUF with a vision
projector (``mmproj``) beside it.

A folder is vision-language when its ``config.json`` names an architecture transformers
loads with ``AutoModelForImageTextToText`` (the well-known ones are listed here), or any
``…ForConditionalGeneration`` whose config carries a ``vision_config`` (how every newer
image-text model is written). A GGUF is vision-capable when a projector file (a GGUF of
architecture ``clip`` with ``clip.has_vision_encoder``) sits in the same folder: one
projector in a folder serves every model there; with several, a model takes the one whose
name shares the longest start with its own (``mmproj-Qwen2-VL-2B-f16.gguf`` beside
``Qwen2-VL-2B-Q4_K_M.gguf``), and no projector (an ambiguous pairing) rather than a guess
when two tie.

How many tokens an image becomes (the prompt bound's image term, core/image_tokens.py) is
read from the projector's header for a GGUF, and from the folder's processor settings
(``processor_config.json``, its image processor nested there or in
``preprocessor_config.json``) for a transformers folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from fitbox.core.image_tokens import ImageTokens, processor_image_tokens, projector_image_tokens
from fitbox.core.projector import ProjectorShape

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")

# MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES (transformers models/auto/modeling_auto.py):
# the decoder-only chat families people run; others are found by the vision_config rule.
VISION_ARCHITECTURES = frozenset(
    {
        "LlavaForConditionalGeneration",
        "LlavaNextForConditionalGeneration",
        "LlavaOnevisionForConditionalGeneration",
        "Idefics2ForConditionalGeneration",
        "Idefics3ForConditionalGeneration",
        "SmolVLMForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
        "Gemma3ForConditionalGeneration",
        "PaliGemmaForConditionalGeneration",
        "Mistral3ForConditionalGeneration",
        "MllamaForConditionalGeneration",
        "Llama4ForConditionalGeneration",
        "InternVLForConditionalGeneration",
        "AyaVisionForConditionalGeneration",
        "Glm4vForConditionalGeneration",
        "Lfm2VlForConditionalGeneration",
    }
)
_PREFIXES = ("mmproj-", "mmproj_", "mmproj.", "mmproj")
_SUFFIXES = ("-mmproj", "_mmproj", ".mmproj")


def is_vision_config(config: Mapping[str, Any]) -> bool:
    """Whether a folder's ``config.json`` describes a vision-language model."""
    archs = config.get("architectures")
    names = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    if any(a in VISION_ARCHITECTURES for a in names):
        return True
    return isinstance(config.get("vision_config"), dict) and any(
        a.endswith("ForConditionalGeneration") for a in names
    )


def _stem(path: Path) -> str:
    """A projector's name without its ``mmproj`` tag, lowercased (what it is the eyes of)."""
    stem = path.name[:-5] if path.name.lower().endswith(".gguf") else path.name
    stem = stem.lower()
    for tag in _PREFIXES:
        if stem.startswith(tag):
            return stem[len(tag) :]
    for tag in _SUFFIXES:
        if stem.endswith(tag):
            return stem[: -len(tag)]
    return stem


def _shared_start(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def pair_projectors(models: Iterable[Path], projectors: Iterable[Path]) -> dict[Path, Path]:
    """Each model file with the projector it launches beside (``--mmproj``), per folder."""
    by_folder: dict[Path, list[Path]] = {}
    for projector in projectors:
        by_folder.setdefault(projector.parent, []).append(projector)
    paired: dict[Path, Path] = {}
    for model in models:
        here = sorted(by_folder.get(model.parent, ()))
        if len(here) == 1:
            paired[model] = here[0]
        elif here:
            name = model.name.lower()
            shared = {p: _shared_start(name, _stem(p)) for p in here}
            best = max(shared.values())
            winners = [p for p, n in shared.items() if n == best]
            if best > 0 and len(winners) == 1:
                paired[model] = winners[0]
    return paired


def image_tokens(path: Path, projector: ProjectorShape | None) -> ImageTokens | None:
    """At most how many tokens one image becomes in the model at ``path``: by its projector
    (a GGUF launched with ``--mmproj``), else by its folder's processor; None when neither
    says (an unknown kind: its images are bounded by their bytes)."""
    if projector is not None:
        return projector_image_tokens(projector)
    if not path.is_dir():
        return None
    stamps = []
    for name in PROCESSOR_FILES:
        try:
            stamps.append((path / name).stat().st_mtime_ns)
        except OSError:
            stamps.append(0)
    return _folder_image_tokens(path, tuple(stamps))


@lru_cache(maxsize=64)
def _folder_image_tokens(folder: Path, stamps: tuple[int, ...]) -> ImageTokens | None:
    processor, images = _json(folder / PROCESSOR_FILES[0]), _json(folder / PROCESSOR_FILES[1])
    nested = processor.get("image_processor")
    if isinstance(nested, dict):  # transformers 5 writes one processor_config.json
        images = {**images, **nested}
    kind = processor.get("processor_class", images.get("processor_class"))
    return processor_image_tokens(str(kind or ""), processor, images)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}

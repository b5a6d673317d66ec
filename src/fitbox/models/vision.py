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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES (transformers models/auto/modeling_auto.py):
# the decoder-only chat families people run; others are found by the vision_config rule.
VISION_ARCHITECTURES = frozenset({
    "LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration",
    "LlavaOnevisionForConditionalGeneration", "Idefics2ForConditionalGeneration",
    "Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration",
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration", "Gemma3ForConditionalGeneration",
    "PaliGemmaForConditionalGeneration", "Mistral3ForConditionalGeneration",
    "MllamaForConditionalGeneration", "Llama4ForConditionalGeneration",
    "InternVLForConditionalGeneration", "AyaVisionForConditionalGeneration",
    "Glm4vForConditionalGeneration", "Lfm2VlForConditionalGeneration",
})  # fmt: skip
_PREFIXES = ("mmproj-", "mmproj_", "mmproj.", "mmproj")
_SUFFIXES = ("-mmproj", "_mmproj", ".mmproj")


def is_vision_config(config: Mapping[str, Any]) -> bool:
    """Whether a folder's ``config.json`` describes a vision-language model."""
    archs = config.get("architectures")
    names = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    if any(a in VISION_ARCHITECTURES for a in names):
        return True
    return isinstance(config.get("vision_config"), dict) and any(
        a.endswith("ForConditionalGeneration") for a in names)  # fmt: skip


def _stem(path: Path) -> str:
    """A projector's name without its ``mmproj`` tag, lowercased (what it is the eyes of)."""
    stem = path.name[:-5] if path.name.lower().endswith(".gguf") else path.name
    stem = stem.lower()
    for tag in _PREFIXES:
        if stem.startswith(tag):
            return stem[len(tag):]
    for tag in _SUFFIXES:
        if stem.endswith(tag):
            return stem[: -len(tag)]
    return stem


def _shared_start(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))  # fmt: skip


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

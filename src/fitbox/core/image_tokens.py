"""How many prompt tokens one image becomes in a model's engine, at most: the image part of
the prompt bound (core/prompts.py). Pure maths; FORMULAS.md §Image tokens has the sources.

A fixed-resolution encoder resizes every image to one tile, so each image is the same
number of tokens; a dynamic-resolution one (Qwen-VL) resizes it to a multiple of its token
side within a pixel budget, so the count follows the image's size, read from its header
(core/image_header.py). A projector or processor this module does not know has no count
(None): its images are bounded by their bytes, as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fitbox.core.projector import ProjectorShape

# clip.cpp clip_n_output_tokens: one token per patch of the resized image_size² tile
# (``mlp``, ``mlp_norm``: LLaVA 1.5 and kin); ``ldp``/``ldpv2`` (MobileVLM) pool 2×2 and
# may add a begin and an end embedding
_PER_PATCH = frozenset({"mlp", "mlp_norm"})
_POOLED = frozenset({"ldp", "ldpv2"})
# Qwen-VL mergers: a token per 2×2 patches of the resized image (clip_n_output_tokens
# divides by 2 × patch_size whatever the merge key says), within set_limit_image_tokens(8,
# 4096) — fitbox passes neither --image-min-tokens nor --image-max-tokens
_QWEN = frozenset({"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"})
QWEN_MERGE = 2
QWEN_TOKENS = (8, 4096)
# the text mtmd.cpp init_vision wraps each image in (tokenized: at most a token a byte)
_WRAPS = {
    "gemma3": "<start_of_image><end_of_image>",
    **{kind: "<|vision_start|><|vision_end|>" for kind in _QWEN},
}
GEMMA3_MERGE = 4  # clip.cpp load_hparams: Gemma 3's default projector scale factor
# a processor's own marks around an image's tokens (Gemma 3: "\n\n<start_of_image>" …
# "<end_of_image>\n\n"; PaliGemma: BOS and "\n" after them), at most this many
PROCESSOR_WRAP = 8
# a float32 product in the engine may land this far from the exact one (a side's token
# count is floored or ceiled from it: the bound takes the far side)
SLACK = 0.01


@dataclass(frozen=True)
class ImageTokens:
    """At most how many prompt tokens one image becomes: ``fixed`` for every image, or a
    dynamic resize to ``side``-pixel tokens within [min_pixels, max_pixels]; plus
    ``extra`` tokens of marks around each image."""

    fixed: int = 0
    side: int = 0
    min_pixels: int = 0
    max_pixels: int = 0
    extra: int = 0

    def bound(self, dims: tuple[int, int] | None) -> int | None:
        """Tokens one image of ``dims`` (width, height) becomes at most; None when that
        depends on a size its header did not give."""
        if self.fixed:
            return self.fixed + self.extra
        if dims is None or self.side <= 0:
            return None
        return resized_tokens(dims, self.side, self.min_pixels, self.max_pixels) + self.extra


def resized_tokens(dims: tuple[int, int], side: int, min_pixels: int, max_pixels: int) -> int:
    """Tokens of an image after a Qwen-VL ``smart_resize`` (mtmd-image.cpp
    calc_size_preserved_ratio; transformers' qwen2_vl image processor): each side rounded to
    a multiple of ``side``; scaled down (floored) past ``max_pixels``, up (ceiled) below
    ``min_pixels``. The engine rounds in float32 and half away from zero, transformers
    half to even: every case either rounding could take is bounded and the largest kept."""
    width, height = dims
    near_hi = max(1, math.floor(width / side + 0.5)) * max(1, math.floor(height / side + 0.5))
    near_lo = max(1, math.ceil(width / side - 0.5)) * max(1, math.ceil(height / side - 0.5))
    area, budget = width * height, max_pixels // (side * side)
    cases = []
    if near_lo * side * side <= max_pixels:  # kept at its rounded size
        cases.append(min(near_hi, budget) if near_hi * side * side > max_pixels else near_hi)
    if near_hi * side * side > max_pixels:  # scaled down into the budget
        beta = math.sqrt(area / max_pixels)
        cases.append(
            max(1, math.floor(width / beta / side + SLACK))
            * max(1, math.floor(height / beta / side + SLACK))
        )
    if min_pixels and near_lo * side * side < min_pixels:  # scaled up to the floor
        beta = math.sqrt(min_pixels / area)
        cases.append(
            math.ceil(width * beta / side + SLACK) * math.ceil(height * beta / side + SLACK)
        )
    return max(cases)


def projector_image_tokens(p: ProjectorShape) -> ImageTokens | None:
    """Per image, from an ``--mmproj`` projector's header (clip.cpp clip_n_output_tokens
    and mtmd.cpp init_vision of this llama-server build); None for a kind not covered."""
    if not p.patch_size or not p.image_size:
        return None
    patches = (p.image_size // p.patch_size) ** 2
    wrap = len(_WRAPS.get(p.projector_type, "").encode())
    if p.projector_type in _PER_PATCH | _POOLED and p.pinpoints:
        return None  # LLaVA-1.6 slices an image into tiles of its grid (llava_uhd)
    if p.projector_type in _PER_PATCH:
        return ImageTokens(fixed=patches)
    if p.projector_type in _POOLED:
        return ImageTokens(fixed=patches // 4 + 2)
    if p.projector_type == "gemma3":
        merge = p.n_merge or GEMMA3_MERGE
        return ImageTokens(fixed=patches // (merge * merge), extra=wrap)
    if p.projector_type in _QWEN:
        side = p.patch_size * QWEN_MERGE
        low, high = QWEN_TOKENS
        return ImageTokens(
            side=side, min_pixels=low * side * side, max_pixels=high * side * side, extra=wrap
        )
    return None


def processor_image_tokens(
    processor_class: str, processor: Mapping[str, object], images: Mapping[str, object]
) -> ImageTokens | None:
    """Per image, from a transformers folder's ``processor_config.json`` (``processor``)
    and its image processor's settings (``images``: nested there, or
    ``preprocessor_config.json``); None for a processor not covered."""
    if processor_class == "LlavaProcessor":
        # processing_llava.py: (height // patch) × (width // patch) of the processed
        # pixels + num_additional_image_tokens, one fewer for the "default" strategy
        patch = _int(processor.get("patch_size"))
        crop = images.get("crop_size") if images.get("do_center_crop", True) else None
        height, width = _hw(crop)
        if not patch or not height or not width:
            return None
        extra = _int(processor.get("num_additional_image_tokens"))
        return ImageTokens(fixed=(height // patch) * (width // patch) + extra)
    if processor_class in ("Gemma3Processor", "PaliGemmaProcessor"):
        if images.get("do_pan_and_scan"):
            return None  # pan and scan adds crops, each image_seq_length more
        seq = _int(processor.get("image_seq_length"))
        return ImageTokens(fixed=seq, extra=PROCESSOR_WRAP) if seq else None
    if processor_class in ("Qwen2VLProcessor", "Qwen2_5_VLProcessor"):
        patch, merge = _int(images.get("patch_size")), _int(images.get("merge_size"))
        size = images.get("size") if isinstance(images.get("size"), dict) else {}
        assert isinstance(size, dict)
        low = _int(images.get("min_pixels")) or _int(size.get("shortest_edge"))
        high = _int(images.get("max_pixels")) or _int(size.get("longest_edge"))
        if not patch or not merge or not high:
            return None
        return ImageTokens(
            side=patch * merge, min_pixels=low, max_pixels=high, extra=PROCESSOR_WRAP
        )
    return None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _hw(size: object) -> tuple[int, int]:
    if isinstance(size, dict):
        return _int(size.get("height")), _int(size.get("width"))
    return (_int(size), _int(size))

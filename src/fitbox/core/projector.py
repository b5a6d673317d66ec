"""A multimodal projector's bytes (``llama-server --mmproj``): its weights and its compute
buffer join the text model's footprint. Pure maths; FORMULAS.md §Projector has the terms.

The catalog pairs a GGUF with the projector beside it (models/vision.py), the candidate
carries its shape, and core/costs.py adds these bytes on the device the projector runs on.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitbox.core.types import Footprint

F32_BYTES = 4
TENSOR_ALIGNMENT = 32  # the CPU buffer clip.cpp allocates its weights in aligns each tensor
# Compute per image position at the peak of a ViT layer (FA on, the engine's default):
# min(layers, 3) residual-width rows, the FFN row, and a few values (fitted on LLaVA-style
# projectors, patch 14, 2..12 layers: the peak stops growing at three layers).
PEAK_LAYERS = 3
POSITION_EXTRA = 80


@dataclass(frozen=True)
class ProjectorShape:
    """The header facts of a vision projector (models/ reads ``clip.vision.*``)."""

    weights_bytes: int  # Σ tensor bytes, each padded to TENSOR_ALIGNMENT
    projector_type: str  # clip.projector_type ("mlp" is the one the compute fit covers)
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    class_token: bool = True
    # what decides an image's tokens (core/image_tokens.py): clip.vision.projector.
    # scale_factor (0: absent) and whether clip.vision.image_grid_pinpoints slices images
    n_merge: int = 0
    pinpoints: bool = False

    @property
    def positions(self) -> int:
        """Patches of the warm-up image (clip.cpp reserves for image_size²) plus the class
        token."""
        side = self.image_size // self.patch_size if self.patch_size else 0
        return side * side + (1 if self.class_token else 0)


def aligned(n_bytes: int) -> int:
    return (n_bytes + TENSOR_ALIGNMENT - 1) // TENSOR_ALIGNMENT * TENSOR_ALIGNMENT


def projector_footprint(p: ProjectorShape) -> Footprint:
    """What ``--mmproj`` adds: its weights, read into an allocated buffer (not mapped), and
    the compute buffer ``reserve_compute_meta`` reserves for one warm-up image."""
    rows = min(p.n_layer, PEAK_LAYERS) * p.n_embd + p.n_ff + POSITION_EXTRA
    return Footprint(
        weights=p.weights_bytes, kv=0, compute=F32_BYTES * p.positions * rows, output=0
    )


def with_projector(text: Footprint, projector: ProjectorShape | None) -> Footprint:
    """The text model's footprint with a projector's bytes added (on the same device)."""
    if projector is None:
        return text
    extra = projector_footprint(projector)
    return Footprint(
        text.weights + extra.weights, text.kv, text.compute + extra.compute, text.output
    )

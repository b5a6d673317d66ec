"""Pins in a model name: ``model@moe``, ``@4bit``, ``@max-gpu``, ``@ram``, ``@Q4_K_M``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fitbox.core.types import RUNG_ORDER, Rung

RUNG_PINS: dict[str, tuple[Rung, ...]] = {
    "gpu": (Rung.GPU_ONLY,),
    "gpu-only": (Rung.GPU_ONLY,),
    "moe": (Rung.MOE_SPLIT,),
    "4bit": (Rung.FOUR_BIT,),
    "ram": (Rung.RAM_ONLY,),
    "ram-only": (Rung.RAM_ONLY,),
    "max-ram": (Rung.MAX_RAM,),
    "max-gpu": (Rung.MAX_GPU,),
}
_QUANT = re.compile(r"^(I?Q\d\w*|F16|BF16|F32)$", re.IGNORECASE)


@dataclass(frozen=True)
class Pins:
    name: str  # the model name without its pins
    rungs: tuple[Rung, ...] = RUNG_ORDER
    quant: str | None = None


def parse(name: str) -> Pins:
    """Split pins off a model name. A suffix that is neither a rung nor a quant stays part of
    the name (a file may have an ``@`` in it)."""
    base, _, rest = name.partition("@")
    if not rest:
        return Pins(name)
    rungs: tuple[Rung, ...] = RUNG_ORDER
    quant = None
    for pin in rest.split("@"):
        key = pin.lower()
        if key in RUNG_PINS:
            rungs = RUNG_PINS[key]
        elif _QUANT.match(pin):
            quant = pin.upper()
        else:
            return Pins(name)
    return Pins(base, rungs, quant)

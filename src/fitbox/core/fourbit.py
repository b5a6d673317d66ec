"""The 4bit rung of a variant its engine quantizes at load (bitsandbytes for a transformers
folder): the same artifact, priced by its weights at 4-bit, its facts filed apart. Pure.

A GGUF's 4bit rung loads another file (a Q4-class variant, ``decide.rung_jobs``); a
full-precision folder whose engine reports it can do 4-bit (``fitbox engines``) is loaded
quantized instead, and only then is this rung offered for it.
"""

from __future__ import annotations

from dataclasses import replace

from fitbox.core.ask import Candidate

FOUR_BIT_CLASS = "/4bit"  # measured facts of a 4-bit load are filed apart from full precision


def in_place(candidate: Candidate) -> Candidate | None:
    """``candidate`` loaded in 4-bit: its weights term replaced by the 4-bit bytes, and what
    4-bit loads measured as its own facts; None when its engine cannot quantize it."""
    if candidate.four_bit_weights is None or candidate.shape is None or candidate.load_in_4bit:
        return None
    # the layout's bytes are full precision: a 4-bit load is priced as one whole model
    return replace(
        candidate.facts_filed_under(FOUR_BIT_CLASS),
        shape=replace(candidate.shape, weights_bytes=candidate.four_bit_weights),
        layout=None,
        four_bit=True,
        load_in_4bit=True,
    )


def placement_suffix(candidate: Candidate) -> str:
    """What a 4-bit load's facts are filed under, after its placement class."""
    return FOUR_BIT_CLASS if candidate.load_in_4bit else ""

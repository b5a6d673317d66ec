"""When fitbox launches a variant with ``--no-repack``: the same candidate priced by its
mapped file alone, tried after the repacked one missed for lack of room (core/repack.py has
the rule for what repacks). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fitbox.core.ask import Candidate
from fitbox.core.decision import Rejected
from fitbox.core.repack import NO_REPACK_CLASS, RepackReason, host_weights
from fitbox.core.split import Placement, in_ram
from fitbox.core.types import WEIGHTS_IN_RAM, Rung

# Rejections no amount of RAM changes (core/decision.py RejectReason values): no second try.
NOT_ABOUT_ROOM = frozenset(
    {
        "no_gpu",
        "no_gpu_backend",
        "not_moe",
        "needs_layout",
        "no_partial_offload",
        "kv_type",
        "beyond_training",
        "no_cores",
    }
)


def without(
    candidate: Candidate, rung: Rung, rejected: Sequence[Rejected] = (), placed: bool = False
) -> Candidate | None:
    """The same variant launched with ``--no-repack``, priced by the file alone and by what
    loads with that flag measured; None when there is no need (``placed``: the repacked try
    fits) or the flag would change nothing: a rung with no weights in RAM, an engine or
    file with nothing to repack, or a last rejection (``rejected[-1]``, the repacked try's)
    that is not about room."""
    shape, cpu = candidate.shape, candidate.cpu
    if placed or candidate.no_repack or rung not in WEIGHTS_IN_RAM or not shape or not cpu:
        return None
    if rejected and rejected[-1].reason in NOT_ABOUT_ROOM:
        return None
    if not host_weights(shape.tensors, cpu).repacked:
        return None
    return replace(candidate.facts_filed_under(NO_REPACK_CLASS), no_repack=True)


def placement_suffix(candidate: Candidate) -> str:
    """What a --no-repack load's facts are filed under, after its placement class."""
    return NO_REPACK_CLASS if candidate.no_repack else ""


def repack_reason(candidate: Candidate, placement: Placement) -> RepackReason:
    """What the placement does about repacking: the flag fitbox launches it with."""
    if candidate.no_repack:
        return RepackReason.RAM_BOUND
    found = in_ram(candidate.shape, placement, candidate.cpu) if candidate.shape else None
    if found is None or not found.repacked:
        return RepackReason.NONE
    return RepackReason.ON

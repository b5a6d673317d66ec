"""What a call asks of the core: a model resolved to approved variants, and its needs."""

from __future__ import annotations

from dataclasses import dataclass, replace

from fitbox.core.projector import ProjectorShape
from fitbox.core.repack import CpuFeatures
from fitbox.core.sizing import ModelShape
from fitbox.core.slots import Slots, choose
from fitbox.core.split import Layout
from fitbox.core.types import RUNG_ORDER, Footprint, Goal, Priority, Rung


@dataclass(frozen=True)
class Speeds:
    """Measured rates of one artifact on one rung. ``None``: never measured, never guessed."""

    load_seconds: float | None = None
    prompt_ms: float | None = None  # per prompt token
    decode_ms: float | None = None  # per output token
    threads: tuple[tuple[int, float], ...] = ()  # (threads, decode tokens/s): bandwidth curve


@dataclass(frozen=True)
class MeasuredFit:
    """What a load really took. ``where`` is the placement class: the device id of a
    single-device placement."""

    where: str
    window: int
    type_k: str
    type_v: str
    footprint: Footprint


@dataclass(frozen=True)
class Candidate:
    """One approved variant (one weight file) of the asked model."""

    key: str
    quant: str = ""
    shape: ModelShape | None = None
    layout: Layout | None = None  # per-layer bytes: needed for splits and partial offload
    fixed: Footprint | None = None  # a footprint that does not depend on the window
    four_bit: bool = False  # a Q4-class quant
    measured: tuple[MeasuredFit, ...] = ()
    refused_windows: tuple[tuple[str, int], ...] = ()  # (placement class, window): failed
    loaded_windows: tuple[tuple[str, int], ...] = ()  # (placement class, window): loaded
    speeds: tuple[tuple[Rung, Speeds], ...] = ()
    terminal: str | None = None  # a bad artifact or an engine that cannot run it
    cpu: CpuFeatures | None = None  # the engine's CPU features: what repacks in RAM
    no_repack: bool = False  # launched with --no-repack: priced by the mapped file alone
    projector: ProjectorShape | None = None  # a vision projector launched beside it (--mmproj)
    # weights once its engine quantizes them to 4-bit at load (bitsandbytes); None: it
    # cannot, the 4bit rung needs a Q4-class variant (core/fourbit.py)
    four_bit_weights: int | None = None
    load_in_4bit: bool = False  # this candidate is that load: launched quantized
    no_four_bit: str = ""  # why its engine cannot quantize it as it loads ("": it can, or n/a)
    partial_offload: bool = True  # its engine can put some layers on a GPU, the rest in RAM
    on_gpus: bool = True  # its engine can load onto a GPU at all (a GPU backend is built in)

    @property
    def is_moe(self) -> bool:
        return self.layout is not None and any(self.layout.routed_bytes)

    def speeds_on(self, rung: Rung) -> Speeds | None:
        return next((s for r, s in self.speeds if r is rung), None)

    def measured_fit(self, where: str, window: int, type_k: str, type_v: str) -> Footprint | None:
        for m in self.measured:
            if (m.where, m.window, m.type_k, m.type_v) == (where, window, type_k, type_v):
                return m.footprint
        return None

    def facts_filed_under(self, suffix: str) -> Candidate:
        """This candidate with only the facts filed under placement classes ending in
        ``suffix`` (a ``--no-repack`` or 4-bit load's own), the suffix taken off: priced as
        that kind of load, never from the other kind's measurements."""

        def own(pairs: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
            return tuple((w.removesuffix(suffix), n) for w, n in pairs if w.endswith(suffix))

        return replace(
            self,
            measured=tuple(
                replace(m, where=m.where.removesuffix(suffix))
                for m in self.measured
                if m.where.endswith(suffix)
            ),
            refused_windows=own(self.refused_windows),
            loaded_windows=own(self.loaded_windows),
        )

    def window_cap(self, where: str) -> int | None:
        """The lowest refused window with no success at or above it: out of reach."""
        loaded = [w for c, w in self.loaded_windows if c == where]
        best_loaded = max(loaded, default=0)
        refused = [w for c, w in self.refused_windows if c == where and w > best_loaded]
        return min(refused, default=None)


@dataclass(frozen=True)
class Ask:
    model: str
    candidates: tuple[Candidate, ...]  # approved variants, best quality first
    need: int = 1  # tokens one call needs in its slot: prompt + max tokens
    window: int = 4096  # the preferred window (all slots together)
    parallel: int = 1
    kv_types: tuple[tuple[str, str], ...] = (("f16", "f16"),)  # (K, V), preferred first
    rungs: tuple[Rung, ...] = RUNG_ORDER  # allowed rungs, in ladder order
    quant: str | None = None  # a pinned quant ("Q4_K_M"): only that variant
    goal: Goal = Goal.QUALITY
    priority: Priority = Priority.FOREGROUND
    max_wait: float = 120.0  # seconds this call may wait for room
    prompt_tokens: int = 0
    max_tokens: int = 0
    cpu_floor: int = 1  # free physical cores a rung with weights in RAM needs at least

    @property
    def slots(self) -> Slots:
        """The slots a child placed for this ask gets (core/slots.py)."""
        return choose(self.parallel)

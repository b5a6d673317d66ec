"""From a name a call asked for to the core's ``Ask``.

A name is parsed once per call (``Named``: its pins, its family, the variants it may be);
the knobs that apply are the model's own, else the box's, else the start-up settings
(box/preferences.py). Facts the core reads first: a measured footprint for the same file,
placement class, window, slots and cache types replaces the estimate; every measured load
marks its window as reachable; a load that ran out of memory marks its window as refused;
measured load seconds are the load term of T. Nothing here guesses a speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fitbox.config import Config
from fitbox.core.ask import Ask, Candidate, MeasuredFit, Speeds
from fitbox.core.fourbit import FOUR_BIT_CLASS
from fitbox.core.pins import Pins
from fitbox.core.pins import parse as parse_pins
from fitbox.core.repack import NO_REPACK_CLASS, CpuFeatures
from fitbox.core.slots import choose
from fitbox.core.types import Goal, Rung
from fitbox.engines.seam import Abilities
from fitbox.models.catalog import Artifact, Catalog, is_four_bit
from fitbox.store.db import MeasuredFootprint

from .facts import Facts, priced
from .preferences import Preferences
from .speeds import SpeedBook

VERDICT_KV_TYPES = ("f16", "q8_0", "q4_0")


@dataclass(frozen=True)
class Named:
    """A model name as a call asked for it, parsed once: ``Qwen3-8B@Q4_K_M@gpu``."""

    asked: str  # with its pins
    pins: Pins
    artifacts: tuple[Artifact, ...]  # the variants it may be, best first

    @property
    def family(self) -> str:
        return self.pins.name

    @property
    def first(self) -> Artifact:
        return self.artifacts[0]

    def admits(self, artifact: Artifact, rung: Rung) -> bool:
        """Whether a resident of ``artifact`` on ``rung`` serves this name as asked."""
        if artifact not in self.artifacts or rung not in self.pins.rungs:
            return False
        return not self.pins.quant or artifact.facts.quant.upper() == self.pins.quant


def candidate(
    artifact: Artifact,
    measured: Iterable[MeasuredFootprint],
    refused: Iterable[tuple[str, int]] = (),
    rates: Mapping[Rung, Speeds] | None = None,
    cpu: CpuFeatures | None = None,
    abilities: Abilities | None = None,
) -> Candidate:
    """One variant as the core sees it; ``measured`` holds this file's footprints only."""
    fits, loaded, speeds = [], [], {}
    can = abilities or Abilities()
    for m in measured:
        footprint = priced(m, artifact)  # with the projector it launches with now
        if footprint is not None:
            fits.append(MeasuredFit(m.device, m.window, m.type_k, m.type_v, footprint))
        loaded.append((m.device, m.window))
        if m.load_seconds is not None:
            host = m.device.removesuffix(FOUR_BIT_CLASS).removesuffix(NO_REPACK_CLASS) == "host"
            rung = Rung.RAM_ONLY if host else Rung.GPU_ONLY
            speeds[rung] = Speeds(load_seconds=m.load_seconds)
    for rung, rate in (rates or {}).items():  # engine timings: prompt and decode ms per token
        if rate.prompt_ms is not None or rate.decode_ms is not None:
            load = speeds.get(rung, Speeds()).load_seconds
            speeds[rung] = Speeds(load, rate.prompt_ms, rate.decode_ms, rate.threads)
    return Candidate(
        key=artifact.key,
        quant=artifact.facts.quant,
        shape=artifact.facts.shape,
        layout=artifact.facts.layout,
        four_bit=is_four_bit(artifact.facts.quant),
        measured=tuple(fits),
        loaded_windows=tuple(loaded),
        refused_windows=tuple(refused),
        speeds=tuple(speeds.items()),
        cpu=cpu,
        projector=artifact.projector,
        four_bit_weights=artifact.facts.four_bit_weights if can.four_bit_in_place else None,
        no_four_bit=can.four_bit_problem,
        partial_offload=can.partial_offload,
        on_gpus=can.gpus,
    )


def _unknown(artifact: Artifact) -> CpuFeatures | None:
    return None


def _whole(artifact: Artifact) -> Abilities:
    return Abilities()


class Asks:
    def __init__(
        self,
        config: Config,
        catalog: Catalog,
        prefs: Preferences,
        facts: Facts,
        speeds: SpeedBook,
        cpu: Callable[[Artifact], CpuFeatures | None] = _unknown,
        abilities: Callable[[Artifact], Abilities] = _whole,
    ) -> None:
        self.config, self.catalog, self.prefs = config, catalog, prefs
        self.facts, self.speeds = facts, speeds
        self.cpu = cpu  # the CPU features of the engine that would load an artifact
        self.abilities = abilities  # what that engine can do beyond a whole load

    def named(self, name: str) -> Named:
        """Parse ``name`` and resolve its variants (``model_not_found`` when none)."""
        pins = parse_pins(name)
        return Named(name, pins, tuple(self.catalog.variants(pins.name)))

    def settings_for(self, name: str, artifacts: Iterable[Artifact] = ()) -> Mapping[str, Any]:
        """Effective knobs for a model: its own (by the name asked, else a variant's name),
        else the box's, else the start-up settings."""
        for key in [name, *(a.name for a in artifacts)]:
            if key in self.prefs.pairs:
                return self.prefs.effective(key)
        return self.prefs.effective()

    def knobs(self, named: Named) -> Mapping[str, Any]:
        return self.settings_for(named.family, named.artifacts)

    def candidate(self, artifact: Artifact, parallel: int) -> Candidate:
        identity = artifact.identity()
        rates = {Rung(r): v for r, v in self.speeds.by_rung(artifact, identity).items()}
        return candidate(
            artifact,
            self.facts.of(identity, parallel),
            self.facts.refused(artifact),
            rates,
            self.cpu(artifact),
            self.abilities(artifact),
        )

    def ask(
        self,
        named: Named,
        *,
        window: int | None = None,
        parallel: int | None = None,
        kv: str | None = None,
        need: int = 1,
        max_tokens: int = 0,
        all_kv: bool = False,
    ) -> Ask:
        """The core's ask for a call on ``named``; ``all_kv`` adds the common quantized
        caches after the configured ones (for verdicts: a band per K/V type)."""
        parallel = choose(parallel or self.config.parallel).count  # as the child gets it
        if all(a.task for a in named.artifacts):  # a task child runs one call at a time
            parallel = 1  # (engines/tasks.py): the others wait at the door, in the queue
        eff = self.knobs(named)
        kv_types = ((kv, kv),) if kv else tuple((k, k) for k in eff["kv_types"])
        if all_kv:
            kv_types += tuple((k, k) for k in VERDICT_KV_TYPES if (k, k) not in kv_types)
        return Ask(
            model=named.asked,
            candidates=tuple(self.candidate(a, parallel) for a in named.artifacts),
            need=need,
            window=window or eff["window"],
            parallel=parallel,
            kv_types=kv_types,
            rungs=tuple(r for r in named.pins.rungs if r.value in eff["rungs"]),
            quant=named.pins.quant or eff["quant"],
            max_wait=eff["max_wait"],
            max_tokens=max_tokens,
            cpu_floor=eff["cpu_floor"],
            goal=Goal(eff["goal"]),
            prompt_tokens=max(need - max_tokens, 0) if need > 1 else 0,
        )

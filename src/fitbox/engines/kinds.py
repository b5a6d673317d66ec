"""The engine kinds this fitbox can run, and which one loads an artifact.

The box asks here for the engine of each artifact it places, so it never names one; a new
kind (the transformers child) is one more entry, a task runner one entry of
``engines/task_runners.py`` in ``on_this_box``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from fitbox.engines.llama_server import LlamaServer
from fitbox.engines.seam import Engine
from fitbox.engines.task_runners import RUNNERS
from fitbox.engines.tasks import TaskEngine
from fitbox.engines.tf import Transformers
from fitbox.errors import EngineFailed
from fitbox.home import Home


class HasFormat(Protocol):
    @property
    def format(self) -> str: ...


class EngineKinds:
    def __init__(self, kinds: Sequence[Engine]) -> None:
        self.kinds = tuple(kinds)

    def for_format(self, artifact_format: str) -> Engine:
        for kind in self.kinds:
            if kind.serves(artifact_format):
                return kind
        known = ", ".join(k.name for k in self.kinds) or "none"
        raise EngineFailed(
            f"No engine on this box loads {artifact_format} models (engine kinds here: {known})."
        )

    def for_artifact(self, artifact: HasFormat) -> Engine:
        return self.for_format(artifact.format)

    async def prepare(self, artifacts: Sequence[HasFormat] = ()) -> None:
        """The probes of the kinds that serve ``artifacts`` (every kind when none are
        named), off the event loop (engines/seam.py ``prepare``): a call waits for its own
        engine's, never another kind's."""
        kinds = self.kinds
        if artifacts:
            formats = {a.format for a in artifacts}
            kinds = tuple(k for k in self.kinds if any(k.serves(f) for f in formats))
        for kind in kinds:
            await kind.prepare()


def engines_home(engine_dir: str, home: Path | None) -> Path | None:
    """Where fitbox builds engine environments: the engine dir setting, else the home's."""
    if engine_dir:
        return Path(engine_dir)
    return Home(home).engines if home is not None else None


def on_this_box(engine_dir: str = "", home: Path | None = None) -> EngineKinds:
    """Every engine kind fitbox knows, in the order it prefers them."""
    engines = engines_home(engine_dir, home)
    support = Home(home).tf_support if home is not None else None
    tasks: list[Engine] = [TaskEngine(spec, engines) for spec in RUNNERS]
    return EngineKinds([LlamaServer(engine_dir), Transformers(engines, support), *tasks])

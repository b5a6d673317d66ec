"""The task runners: one entry per engine that serves a task (speech, transcription, images).

Every runner runs in the one generic task child (``engines/task_child/``, stdlib HTTP plus
the runner's own packages), in an environment fitbox builds from the runner's extra of
fitbox's own package (``engines/task_envs.py``), never in fitbox's venv. A new runner is
this table's entry plus its module ``engines/task_child/<module>.py`` (see
docs/design/engines.md §Task runners).
"""

from __future__ import annotations

from dataclasses import dataclass

TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
SPEECH = "/v1/audio/speech"
IMAGES = "/v1/images/generations"


@dataclass(frozen=True)
class RunnerSpec:
    """One runner: what it loads and serves, and the environment it runs in."""

    name: str  # the engine kind's name, and its environment's folder (<engine dir>/<name>)
    format: str  # the catalog format it loads (models/task_models.py recognises it)
    routes: frozenset[str]  # the OpenAI paths its child answers
    extra: str  # fitbox's optional-dependency list its environment is built from
    modules: tuple[str, ...]  # what a usable environment imports (the probe's list)
    module: str  # its file in engines/task_child/
    license_note: str = ""  # why it lives apart beyond fitbox's rule that engines do


RUNNERS: tuple[RunnerSpec, ...] = (
    RunnerSpec(
        name="faster-whisper",
        format="whisper-ct2",
        routes=frozenset({TRANSCRIPTIONS, TRANSLATIONS}),
        extra="whisper-engine",
        modules=("faster_whisper", "ctranslate2", "av"),
        module="whisper",
    ),
    RunnerSpec(
        name="piper",
        format="piper-onnx",
        routes=frozenset({SPEECH}),
        extra="piper-engine",
        modules=("piper", "onnxruntime", "soundfile"),
        module="piper",
        license_note="GPL-3.0: only ever in its own child process and environment",
    ),
    RunnerSpec(
        name="diffusers",
        format="diffusers",
        routes=frozenset({IMAGES}),
        extra="diffusers-engine",
        modules=("diffusers", "torch", "transformers", "PIL"),
        module="diffusers",
    ),
)


def runner_named(name: str) -> RunnerSpec:
    for spec in RUNNERS:
        if spec.name == name:
            return spec
    known = ", ".join(s.name for s in RUNNERS)
    raise KeyError(f"no task runner named {name!r} (runners: {known})")

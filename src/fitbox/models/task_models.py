"""Task models recognised from their files: what each is, and its shape for placement.

- a CTranslate2 whisper folder: ``model.bin`` + ``config.json`` + a tokenizer
  (``tokenizer.json`` or ``vocabulary.*``), named by its folder; task ``transcription``;
- a piper voice: ``NAME.onnx`` with ``NAME.onnx.json`` beside it, named ``NAME``; task
  ``speech``; its voices are its speakers (``speaker_id_map``), or its dataset's name;
- a diffusers pipeline folder: ``model_index.json`` (the pipeline's class) with its parts in
  folders below it (``unet/``, ``vae/``, ``text_encoder/``…), named by its folder; task
  ``image``.

Placement prices a task model by its files plus what its runner's process holds beside
them (``RUNNER_BYTES``), until its first load measures the process (engines/tasks.py):
from then on the measured figure prices it, as for any model. A new task format is one
entry in ``FORMATS`` and a recogniser below.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fitbox.core.sizing import ModelShape
from fitbox.models.gguf_facts import GGUFFacts

WHISPER = "whisper-ct2"
PIPER = "piper-onnx"
DIFFUSERS = "diffusers"
MIB = 1024 * 1024


@dataclass(frozen=True)
class TaskFormat:
    task: str  # what /v1/models and `fitbox models` say it does
    runner_bytes: int  # the runner's interpreter and libraries, before its first measure


# runner_bytes: a child's RSS after load less its files, measured on this project's test
# models (whisper tiny.en: 247 MB for 78 MB of files; piper joe-medium: 154 MB for 63 MB;
# diffusers: 397 MiB for the tests' 0.5 MB random pipeline, torch and diffusers imported)
FORMATS: dict[str, TaskFormat] = {
    WHISPER: TaskFormat("transcription", 170 * MIB),
    PIPER: TaskFormat("speech", 90 * MIB),
    DIFFUSERS: TaskFormat("image", 400 * MIB),
}


def task_of(artifact_format: str) -> str | None:
    found = FORMATS.get(artifact_format)
    return found.task if found else None


def is_whisper_dir(filenames: list[str]) -> bool:
    names = set(filenames)
    tokenizer = "tokenizer.json" in names or any(n.startswith("vocabulary.") for n in names)
    return "model.bin" in names and "config.json" in names and tokenizer


def is_diffusers_dir(filenames: list[str]) -> bool:
    """A diffusers pipeline's folder (its parts are below it: not descended into, or its
    text encoder would be taken for a transformers model of its own)."""
    return "model_index.json" in filenames


def is_piper_voice(path: Path) -> bool:
    return path.name.endswith(".onnx") and path.with_name(path.name + ".json").is_file()


def _shape(files_bytes: int, artifact_format: str) -> ModelShape:
    """A task model has no layers or window to price: its files and its runner."""
    return ModelShape(
        weights_bytes=files_bytes + FORMATS[artifact_format].runner_bytes,
        n_layer=1,
        n_ctx_train=0,
        n_embd=0,
        n_vocab=0,
        n_head=0,
        kv_heads=(0,),
        key_length=0,
        value_length=0,
        has_kv_cache=False,
    )


def task_facts(path: Path, artifact_format: str) -> GGUFFacts:
    """A task model's facts (raises OSError when its files cannot be read)."""
    if artifact_format == WHISPER:
        files = [p for p in path.iterdir() if p.is_file()]
        name, architecture = path.name, "whisper"
    elif artifact_format == DIFFUSERS:
        files = [p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")]
        name, architecture = path.name, _pipeline_class(path)
    else:
        files = [path, path.with_name(path.name + ".json")]
        name, architecture = path.name.removesuffix(".onnx"), "piper"
    total = sum(os.stat(p).st_size for p in files)
    return GGUFFacts(
        path=path,
        architecture=architecture,
        name=name,
        file_type=None,
        quant="",
        is_projector=False,
        is_embedding=False,
        shape=_shape(total, artifact_format),
    )


def _pipeline_class(path: Path) -> str:
    """The pipeline's class as ``model_index.json`` names it (raises OSError, as a folder
    whose index cannot be read is not a model fitbox can serve)."""
    try:
        index = json.loads((path / "model_index.json").read_text())
    except ValueError as exc:
        raise OSError(f"model_index.json is not JSON: {exc}") from None
    found = index.get("_class_name") if isinstance(index, dict) else None
    return found if isinstance(found, str) else "diffusers"


def voices(path: Path) -> tuple[str, ...]:
    """A piper voice's voices (its speakers by name, or its dataset's name)."""
    try:
        stat = os.stat(path.with_name(path.name + ".json"))
    except OSError:
        return ()
    return _voices(path, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _voices(path: Path, mtime_ns: int) -> tuple[str, ...]:
    try:
        config = json.loads(path.with_name(path.name + ".json").read_text())
    except (OSError, ValueError):
        return ()
    speakers = config.get("speaker_id_map") or {}
    if speakers:
        return tuple(sorted(speakers, key=lambda s: speakers[s]))
    return (str(config.get("dataset") or "default"),)

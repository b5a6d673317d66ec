"""The places models are known to live: Hugging Face caches, Ollama's store, LM Studio's
folders. Each yields hints saying what led to them; nothing here reads a weight file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from .findings import Hint, Limits, Tally
from .mounts import NO_AUTOMOUNTS, Automounts
from .walk import walk

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"


def hf_caches(env: Mapping[str, str], home: Path) -> list[tuple[Path, str]]:
    """(hub cache directory, the setting that named it), the first name for a place kept."""
    found: list[tuple[Path, str]] = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):
        if env.get(var):
            found.append((Path(env[var]), var))
    if env.get("HF_HOME"):
        found.append((Path(env["HF_HOME"]) / "hub", "HF_HOME"))
    cache_home = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    found.append((cache_home / "huggingface" / "hub", "the default cache"))
    return _distinct(found)


def ollama_stores(env: Mapping[str, str], home: Path) -> list[tuple[Path, str]]:
    found = [(Path(env["OLLAMA_MODELS"]), "OLLAMA_MODELS")] if env.get("OLLAMA_MODELS") else []
    found += [
        (home / ".ollama" / "models", "Ollama's default store"),
        (Path("/usr/share/ollama/.ollama/models"), "Ollama's service store"),
        (Path("/var/lib/ollama/.ollama/models"), "Ollama's service store"),
    ]
    return _distinct(found)


def lmstudio_folders(env: Mapping[str, str], home: Path) -> list[tuple[Path, str]]:
    return _distinct(
        [
            (home / ".lmstudio" / "models", "LM Studio's folder"),
            (home / ".cache" / "lm-studio" / "models", "LM Studio's old folder"),
        ]
    )


def _distinct(places: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    seen: set[Path] = set()
    out = []
    for path, why in places:
        if path not in seen:
            seen.add(path)
            out.append((path, why))
    return out


def hf_hints(
    cache: Path, why: str, limits: Limits, tally: Tally, automounts: Automounts = NO_AUTOMOUNTS
) -> Iterator[Hint]:
    """GGUFs in each repo's snapshots (the blobs they link to have no names)."""
    if _behind_automount(cache, automounts, tally):
        return
    try:
        repos = sorted(p for p in cache.iterdir() if p.name.startswith("models--"))
    except OSError:
        return
    for repo in repos:
        repo_id = repo.name.removeprefix("models--").replace("--", "/")
        for path in walk([repo / "snapshots"], limits, tally, automounts):
            yield Hint(
                path,
                "hf_cache",
                f"Hugging Face cache {cache} ({why}), repo {repo_id}",
                name=path.name.removesuffix(".gguf"),
            )


def ollama_hints(
    store: Path, why: str, tally: Tally, max_manifests: int, automounts: Automounts = NO_AUTOMOUNTS
) -> Iterator[Hint]:
    """Each manifest (manifests/HOST/NAMESPACE/MODEL/TAG, JSON) names its layers by digest
    and media type; the model layer's blob (blobs/sha256-HEX) is the GGUF, served in place."""
    manifests = store / "manifests"
    if _behind_automount(store, automounts, tally) or not manifests.is_dir():
        return
    seen = 0
    for dirpath, dirnames, filenames in os.walk(manifests):
        dirnames.sort()
        tally.dirs_visited += 1
        for tag in sorted(filenames):
            seen += 1
            if seen > max_manifests:
                return
            manifest = Path(dirpath) / tag
            rel = manifest.relative_to(manifests)
            name = f"{'/'.join(rel.parts[:-1])}:{rel.parts[-1]}"
            short = name.removeprefix("registry.ollama.ai/").removeprefix("library/")
            try:
                layers = json.loads(manifest.read_text()).get("layers", [])
            except (OSError, ValueError, AttributeError):
                tally.unreadable += 1
                continue
            for layer in layers if isinstance(layers, list) else []:
                if not isinstance(layer, dict) or layer.get("mediaType") != OLLAMA_MODEL_LAYER:
                    continue
                digest = str(layer.get("digest", ""))
                if not digest.startswith("sha256:") or "/" in digest:
                    continue
                blob = store / "blobs" / digest.replace(":", "-")
                yield Hint(
                    blob,
                    "ollama",
                    f"Ollama manifest {name} in {store} ({why}): its model layer {digest[:19]}…",
                    name=short.replace(":", "-"),
                )


def _behind_automount(place: Path, automounts: Automounts, tally: Tally) -> bool:
    """Whether reaching ``place`` would cross an automount point (counted as skipped): a
    known place (HF_HOME, OLLAMA_MODELS, …) on a sleeping share is not woken either."""
    point = automounts.point_over(place)
    if point is not None:
        tally.automounts_skipped.append(str(place))
    return point is not None


def folder_hints(
    folder: Path,
    why: str,
    source: str,
    limits: Limits,
    tally: Tally,
    automounts: Automounts = NO_AUTOMOUNTS,
) -> Iterator[Hint]:
    for path in walk([folder], limits, tally, automounts):
        yield Hint(path, source, f"{why} {folder}")

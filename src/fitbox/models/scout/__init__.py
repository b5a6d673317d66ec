"""``fitbox scout``: where models already are on this machine, found without moving them.

A bounded, read-only search (models/scout/walk.py's limits) of, in order: the model paths
of running engines (live), the stores running Ollamas name in their environment (live),
Ollama's stores, Hugging Face caches, LM Studio's folders, the
roots given (or else every mounted drive; automount points never entered), and paths
fitbox's own store saw before (historical). Each finding says what led to it, and is
servable only once its GGUF header was read (findings.py ``examine``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .findings import HISTORICAL, LIVE, Finding, Hint, Limits, Tally, examine
from .mounts import automounts, drives, read_mounts
from .places import (
    folder_hints,
    hf_caches,
    hf_hints,
    lmstudio_folders,
    ollama_hints,
    ollama_stores,
)
from .processes import process_hints, running_ollama_stores

__all__ = ["HISTORICAL", "LIVE", "Finding", "Hint", "Limits", "Report", "Tally", "scout"]


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)


def _hints(
    roots: list[Path] | None,
    pid: int | None,
    past: Iterable[tuple[Path, str]],
    env: Mapping[str, str],
    home: Path,
    limits: Limits,
    tally: Tally,
    mountinfo: Path | None,
) -> Iterator[Hint]:
    yield from process_hints(pid)
    running = running_ollama_stores(pid)
    for store, why in running:
        yield from ollama_hints(store, why, tally, limits.max_results)
    if pid is not None:
        return  # --pid: that process alone
    mounts = read_mounts(mountinfo) if mountinfo else read_mounts()
    skip = automounts(mounts)
    read = {store for store, _ in running}
    for store, why in ollama_stores(env, home):
        if store in read:
            continue
        yield from ollama_hints(store, why, tally, limits.max_results, skip)
    for cache, why in hf_caches(env, home):
        yield from hf_hints(cache, why, limits, tally, skip)
    for folder, why in lmstudio_folders(env, home):
        yield from folder_hints(folder, why, "lmstudio", limits, tally, skip)
    for root in roots if roots is not None else drives(mounts):
        yield from folder_hints(root, "found walking", "root", limits, tally, skip)
        if tally.dirs_left:
            break
    for path, why in past:  # a path once used, behind a sleeping share now, is not woken
        if skip.point_over(path) is None:
            yield Hint(path, "store", why, evidence=HISTORICAL)
        else:
            tally.automounts_skipped.append(str(path))


def scout(
    roots: list[Path] | None = None,
    *,
    pid: int | None = None,
    past: Iterable[tuple[Path, str]] = (),
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    limits: Limits | None = None,
    mountinfo: Path | None = None,
) -> Report:
    """Findings, one per real file (the first hint to reach a file names it; a live hint
    outranks a historical one for the same file)."""
    import os

    limits = limits or Limits()
    report = Report()
    seen: dict[Path, int] = {}
    for hint in _hints(
        roots,
        pid,
        past,
        os.environ if env is None else env,
        home or Path.home(),
        limits,
        report.tally,
        mountinfo,
    ):
        try:
            real = hint.path.resolve()
        except (OSError, RuntimeError):
            real = hint.path
        if real in seen:
            continue
        if len(report.findings) >= limits.max_results:
            report.tally.results_left += 1
            continue
        seen[real] = len(report.findings)
        report.findings.append(examine(hint))
    return report

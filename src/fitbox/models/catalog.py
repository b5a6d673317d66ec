"""The catalog: models found under the model roots, by name, plus aliases.

A file is a model if it starts with the GGUF magic, whatever its name, and is not a
projector (mmproj). Its name is the file stem. A vision projector in a model's folder is
launched beside it (``--mmproj``; models/vision.py pairs them): the model reads images. A
Hugging Face folder (config.json and safetensors) is a model of the transformers engine,
named by models/hf_folders.py (a cache snapshot is ``owner/repo``). A task model (a whisper
folder, a piper voice, a diffusers pipeline) is recognised by models/task_models.py.
``aliases.toml`` adds other names:

    [aliases]
    smol = "SmolLM2-135M-Instruct.Q4_1"
"""

from __future__ import annotations

import logging
import os
import re
import time
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from fitbox.core.projector import ProjectorShape
from fitbox.core.shard_names import shard_of_stem
from fitbox.errors import ModelNotFound, ModelNotServable
from fitbox.models.facts_cache import FactsCache
from fitbox.models.folder_judge import EngineSupport, read_support
from fitbox.models.gguf_facts import GGUFFacts
from fitbox.models.gguf_header import MAGIC, NotGGUF
from fitbox.models.hf_folders import FORMAT as FOLDER_FORMAT
from fitbox.models.hf_folders import folder_facts, folder_name, folder_problem, is_snapshot_entry
from fitbox.models.identity import Identity, identity_of
from fitbox.models.readable import is_unreadable, unreadable_reason
from fitbox.models.task_models import (
    DIFFUSERS,
    PIPER,
    WHISPER,
    is_diffusers_dir,
    is_piper_voice,
    is_whisper_dir,
    task_facts,
    task_of,
)
from fitbox.models.transformers_facts import BadModelDir
from fitbox.models.vision import pair_projectors

log = logging.getLogger(__name__)

_SKIP_SUFFIXES = (".part", ".tmp", ".partial", ".download")
_QUANT_SUFFIX = re.compile(r"[._-](?:UD-)?(I?Q\d\w*|F16|BF16|F32)$", re.IGNORECASE)
_FOUR_BIT = re.compile(r"^(I?Q4|MXFP4)", re.IGNORECASE)


def family_name(name: str) -> str:
    """A model name without its quant tag: ``Qwen3-8B-Q4_K_M`` -> ``Qwen3-8B``."""
    return _QUANT_SUFFIX.sub("", name)


def is_four_bit(quant: str) -> bool:
    return bool(_FOUR_BIT.match(quant))


RESCAN_AT_MOST_EVERY_S = 1.0


@dataclass(frozen=True)
class Artifact:
    """One weight file fitbox can launch."""

    name: str
    path: Path
    facts: GGUFFacts
    format: str = "gguf"  # which engine kinds can load it (engines/seam.py ``serves``)
    mmproj: Path | None = None  # the vision projector launched beside it
    projector: ProjectorShape | None = None  # that projector's header facts (its bytes)
    seen: Identity | None = None  # the file as the scan that found it saw it

    @property
    def vision(self) -> bool:
        """Whether it reads image inputs (a projector beside it, or a vision-language
        folder)."""
        return self.mmproj is not None or self.facts.vision

    @property
    def task(self) -> str | None:
        """What a task model does (transcription, speech…: models/task_models.py); None
        for a chat, embedding or reranking model."""
        return task_of(self.format)

    @property
    def key(self) -> str:
        return str(self.path)

    def identity(self) -> Identity:
        """One stat of the file now; raises OSError when it is gone. A file that became
        unreadable (its folder's mode changed) is still the file the scan saw: a resident
        child holds it open and serves on, so its facts stay keyed as they were."""
        try:
            return identity_of(self.path)
        except OSError as exc:
            if self.seen is None or not is_unreadable(exc):
                raise
            return self.seen

    def projector_identity(self) -> str | None:
        """The projector launched beside it, as a measurement records it
        (``path|size|mtime_ns``); None without one (or when it is gone)."""
        if self.mmproj is None:
            return None
        try:
            return "|".join(str(part) for part in identity_of(self.mmproj))
        except OSError:
            return None


def _is_transformers_dir(dirpath: Path, filenames: list[str]) -> bool:
    if "config.json" not in filenames and "model_index.json" not in filenames:
        return False
    return any(dirpath.glob("*.safetensors")) or any(dirpath.glob("*/*.safetensors"))


def _walk(root: Path, refused: list[OSError]) -> Iterator[tuple[str, Path]]:
    """("gguf?", file) for every candidate file, ("dir", path) for a transformers model
    directory (not descended into), (its format, path) for a task model (a whisper or a
    diffusers folder, not descended into; a piper voice). In a Hugging Face cache,
    ``blobs/`` is skipped: the files are reached, with their real names, through
    ``snapshots/``. A folder that cannot be listed lands in ``refused``."""
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, onerror=refused.append, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:  # a symlink loop
            dirnames.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        here = Path(dirpath)
        if is_whisper_dir(filenames):
            dirnames.clear()
            yield WHISPER, here
            continue
        if is_diffusers_dir(filenames):
            dirnames.clear()
            yield DIFFUSERS, here
            continue
        if _is_transformers_dir(here, filenames):
            dirnames.clear()
            yield "dir", here
            continue
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and not (d == "blobs" and here.name.startswith("models--"))
        )
        for filename in sorted(filenames):
            if filename.startswith(".") or filename.endswith(_SKIP_SUFFIXES):
                continue
            if is_piper_voice(here / filename):
                yield PIPER, here / filename
                continue
            yield "file", here / filename


def _model_name(path: Path) -> str | None:
    """File stem; for split GGUFs only the first shard names the model."""
    stem = path.name[:-5] if path.name.lower().endswith(".gguf") else path.name
    shard = shard_of_stem(stem)
    if shard:
        return shard.base if shard.index == 1 else None
    return stem


@dataclass(frozen=True)
class Unservable:
    """A file that looks like a model (or a folder under a root) that cannot be served, and
    why; ``name`` is the model it would be, when its name is known; ``unreadable``: fitbox
    may not read it (an operator's chmod or chown fixes it)."""

    path: Path
    reason: str
    name: str | None = None
    unreadable: bool = False


def _opened(path: Path, name: str, rejected: list[Unservable]) -> bool:
    """Whether ``path`` starts with the GGUF magic; a ``.gguf`` file fitbox may not read
    is listed with why (any other unreadable file is not taken for a model)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == MAGIC
    except OSError as exc:
        if is_unreadable(exc) and path.name.lower().endswith(".gguf"):
            rejected.append(Unservable(path, unreadable_reason(path, exc), name, True))
        return False


def _root_refused(root: Path, rejected: list[Unservable]) -> bool:
    """Whether ``root`` is no folder fitbox can walk (an unreadable one is listed)."""
    try:
        if not root.is_dir():
            return True
        os.scandir(root).close()
    except OSError as exc:
        if is_unreadable(exc):
            rejected.append(Unservable(root, unreadable_reason(root, exc), unreadable=True))
        return True
    return False


def scan(
    roots: Iterable[Path], cache: FactsCache | None = None, support: EngineSupport | None = None
) -> tuple[list[Artifact], list[Unservable]]:
    """Every servable GGUF and folder under the roots, and every one that looks like a model
    and is not (``support``: what the transformers engine loads, when a probe said)."""
    cache = cache or FactsCache(None)
    found: dict[str, Artifact] = {}
    rejected: list[Unservable] = []
    projectors: dict[Path, ProjectorShape] = {}
    for root in roots:
        if _root_refused(root, rejected):
            continue
        refused: list[OSError] = []
        for kind, path in _walk(root, refused):
            if kind == "dir":
                _add_folder(path, found, rejected, support)
                continue
            if kind != "file":
                _add_task(path, kind, found, rejected)
                continue
            name = _model_name(path)
            if name is None or not _opened(path, name, rejected):
                continue
            try:
                facts, seen = cache.facts(path), identity_of(path)
            except (NotGGUF, OSError) as exc:
                rejected.append(Unservable(path, f"not a readable GGUF: {exc}"))
                continue
            if facts.is_projector:
                if facts.projector is not None:  # a vision encoder (not an audio one)
                    projectors[path] = facts.projector
                continue
            if facts.unknown_architecture:
                rejected.append(
                    Unservable(
                        path,
                        f"architecture {facts.architecture!r} has no "
                        "block_count: fitbox cannot size it",
                    )
                )
                continue
            if name in found:
                log.warning("%s: name %r already taken by %s", path, name, found[name].path)
                continue
            found[name] = Artifact(name=name, path=path, facts=facts, seen=seen)
        rejected += [_folder_refused(exc) for exc in refused if is_unreadable(exc)]
    cache.save()
    ggufs = {a.path: a for a in found.values() if a.format == "gguf"}
    for model, projector in pair_projectors(ggufs, projectors).items():
        found[ggufs[model].name] = replace(
            ggufs[model], mmproj=projector, projector=projectors[projector]
        )
    return sorted(found.values(), key=lambda a: a.name), rejected


def _add_folder(
    path: Path,
    found: dict[str, Artifact],
    rejected: list[Unservable],
    support: EngineSupport | None,
) -> None:
    """A transformers folder, sized from its headers and judged from its files
    (models/folder_judge.py), or the reason it cannot be served: listed under its name, so
    a call naming it gets that reason, before anything is loaded or evicted."""
    try:
        if is_snapshot_entry(path):
            return  # an older revision of a cached model: refs/main (or the newest) serves
        facts = folder_facts(path)
        problem = folder_problem(facts.path, support)
    except (BadModelDir, ValueError, RecursionError) as exc:  # never stops discovery
        reason = f"not a usable transformers model: {exc}"
        rejected.append(Unservable(path, reason, folder_name(path)))
        return
    except OSError as exc:
        if is_unreadable(exc):
            reason = unreadable_reason(path, exc)
            rejected.append(Unservable(path, reason, folder_name(path), True))
        else:
            rejected.append(Unservable(path, f"not readable: {exc}"))
        return
    name = folder_name(path)
    if problem is not None:
        reason = f"not servable by the transformers engine: {problem}"
        rejected.append(Unservable(path, reason, name))
        return
    if name in found:
        log.warning("%s: name %r already taken by %s", path, name, found[name].path)
        return
    found[name] = Artifact(name=name, path=facts.path, facts=facts, format=FOLDER_FORMAT)


def _add_task(
    path: Path, artifact_format: str, found: dict[str, Artifact], rejected: list[Unservable]
) -> None:
    """A task model (models/task_models.py), or the reason it cannot be served."""
    try:
        facts = task_facts(path, artifact_format)
    except OSError as exc:
        rejected.append(Unservable(path, f"not readable: {exc}"))
        return
    if facts.name in found:
        log.warning("%s: name %r already taken by %s", path, facts.name, found[facts.name].path)
        return
    found[facts.name] = Artifact(
        name=facts.name, path=path, facts=facts, format=artifact_format, seen=identity_of(path)
    )


def _folder_refused(exc: OSError) -> Unservable:
    folder = Path(str(exc.filename))
    return Unservable(folder, unreadable_reason(folder, exc), unreadable=True)


def read_aliases(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
        log.warning("ignoring aliases file %s: %s", path, exc)
        return {}
    table = data.get("aliases", {})
    return {str(k): str(v) for k, v in table.items() if isinstance(v, str)}


class Catalog:
    """Names to artifacts. Rescans the roots when a name is not known yet."""

    def __init__(
        self,
        roots: tuple[Path, ...],
        aliases_file: Path,
        facts_cache: Path | None = None,
        support: Path | None = None,
    ) -> None:
        """``support``: the file a probe of the transformers engine writes (what it loads;
        models/folder_judge.py), read at every scan."""
        self.roots = roots
        self.support_file = support
        self._support: EngineSupport | None = None
        self.aliases_file = aliases_file
        self._cache = FactsCache(facts_cache)
        self._by_name: dict[str, Artifact] = {}
        self._aliases: dict[str, str] = {}
        self.rejected: list[Unservable] = []
        self._problems: dict[str, str] = {}  # a known model's file turned unreadable: why
        self._scanned_at = float("-inf")
        self.refresh()

    def refresh(self, max_age: float = 0.0) -> None:
        """Rescan the roots, unless the last scan is younger than ``max_age`` seconds (so a
        flood of calls naming unknown models cannot turn into a flood of directory walks)."""
        from fitbox.models.pull import builtin_aliases

        now = time.monotonic()
        if now - self._scanned_at < max_age:
            return
        self._scanned_at = now
        self._support = support = read_support(self.support_file)
        artifacts, self.rejected = scan(self.roots, self._cache, support)
        self._by_name, self._problems = self._kept({a.name: a for a in artifacts})
        # what `fitbox pull NAME` fetched answers to NAME; the aliases file may override
        self._aliases = {**builtin_aliases(), **read_aliases(self.aliases_file)}

    def _kept(self, found: dict[str, Artifact]) -> tuple[dict[str, Artifact], dict[str, str]]:
        """The scan's models, plus each model known before whose file fitbox may no longer
        read (its folder's or its own mode changed): it keeps its name, so a child that
        holds it open serves on; its problem says why no new load can read it."""
        by_name, problems = dict(found), {}
        refused = {r.name: r.reason for r in self.rejected if r.unreadable and r.name}
        for name, known in self._by_name.items():
            if name in by_name:
                continue
            reason = refused.get(name) or _stat_refused(known.path)
            if reason is not None:
                by_name[name], problems[name] = known, reason
        return dict(sorted(by_name.items())), problems

    def rejudge(self) -> bool:
        """Scan again when what the transformers engine loads changed since the last scan
        (a probe of its interpreter wrote it): folders are judged by it. Whether it did."""
        if read_support(self.support_file) == self._support:
            return False
        self.refresh()
        return True

    def artifacts(self) -> list[Artifact]:
        return list(self._by_name.values())

    def problem(self, name: str) -> str | None:
        """Why the known model ``name`` cannot be loaded again (its file became
        unreadable); None when nothing is known against it."""
        return self._problems.get(name)

    def unreadable(self) -> list[Unservable]:
        """Every models root, folder or GGUF the last scan could not read."""
        return [r for r in self.rejected if r.unreadable]

    def unreadable_now(self) -> list[str]:
        """Why each path the last scan could not read cannot be, and each models root
        that refuses a listing now (its mode changed since the scan): one stat and one
        open per root, cheap enough for every /health."""
        found = self.unreadable()
        seen = {r.path for r in found}
        for root in self.roots:
            if root not in seen:
                _root_refused(root, found)
        return [r.reason for r in found]

    def _unservable(self, name: str) -> Unservable | None:
        target = self._aliases.get(name, name)
        return next((r for r in self.rejected if r.name == target), None)

    def aliases_of(self, name: str) -> list[str]:
        return sorted(
            alias for alias, target in self._aliases.items() if target == name and alias != name
        )

    def _lookup(self, name: str) -> Artifact | None:
        target = self._aliases.get(name, name)
        return self._by_name.get(target)

    def variants(self, name: str) -> list[Artifact]:
        """The approved variants ``name`` stands for, best quality first. A file's own name
        (or an alias of it) is that file alone; a family name (the file names without their
        quant tag) is every variant on the box, the largest (most bits per weight) first."""
        artifact = self._lookup(name)
        if artifact is not None:
            return [artifact]
        family = self._family(name)
        if not family:
            self.refresh(max_age=RESCAN_AT_MOST_EVERY_S)
            family = self._family(name)
        if not family:
            return [self.resolve(name)]  # raises ModelNotFound with the known names
        return family

    def _family(self, name: str) -> list[Artifact]:
        members = [a for a in self._by_name.values() if family_name(a.name) == name != a.name]
        return sorted(members, key=lambda a: (-a.facts.shape.weights_bytes, a.name))

    def resolve(self, name: str) -> Artifact:
        artifact = self._lookup(name)
        if artifact is None:
            self.refresh(max_age=RESCAN_AT_MOST_EVERY_S)
            artifact = self._lookup(name)
        if artifact is None:
            raise self._missing(name)
        return artifact

    def _missing(self, name: str) -> ModelNotFound | ModelNotServable:
        """The refusal for a name the catalog has no servable file for: the reason its
        file cannot be served when one by that name was found, else not found (saying
        which folders fitbox could not look into)."""
        bad = self._unservable(name)
        if bad is not None:
            return ModelNotServable.because(
                name, bad.reason, unreadable=bad.unreadable, doing="served"
            )
        known = ", ".join(sorted(self._by_name)[:10]) or "none"
        blind = "; ".join(str(r.path) for r in self.unreadable() if r.name is None)
        unseen = f" fitbox cannot read {blind}: a model there is not seen." if blind else ""
        return ModelNotFound(  # where its file goes names the box's folders: insiders only
            f"The model '{name}' does not exist on this box. Known models: {known}.",
            param="model",
            operator_reason=f"Put its GGUF under {os.pathsep.join(map(str, self.roots))} or "
            f"run 'fitbox pull'.{unseen}",
        )


def _stat_refused(path: Path) -> str | None:
    """Why ``path`` cannot be read when a stat is refused by permissions; None when it
    can be stat'ed or is gone."""
    try:
        os.stat(path)
    except OSError as exc:
        return unreadable_reason(path, exc) if is_unreadable(exc) else None
    return None

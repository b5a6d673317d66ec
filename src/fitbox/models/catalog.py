"""The catalog: models found under the model roots, by name, plus aliases.

A file is a model if it starts with the GGUF magic, whatever its name, and is not a
projector (mmproj). Its name is the file stem. A vision projector in a model's folder is
launched beside it (``--mmproj``; models/vision.py pairs them): the model reads images. A
Hugging Face folder (config.json and safetensors) is a model of the transformers engine,
named by models/hf_folders.py (a cache snapshot is ``owner/repo``). ``aliases.toml`` adds
other names:

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
from fitbox.errors import ModelNotFound
from fitbox.models.facts_cache import FactsCache
from fitbox.models.gguf_facts import GGUFFacts
from fitbox.models.gguf_header import NotGGUF, has_gguf_magic
from fitbox.models.hf_folders import FORMAT as FOLDER_FORMAT
from fitbox.models.hf_folders import folder_facts, folder_name, is_snapshot_entry
from fitbox.models.identity import Identity, identity_of
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

    @property
    def vision(self) -> bool:
        """Whether it reads image inputs (a projector beside it, or a vision-language
        folder)."""
        return self.mmproj is not None or self.facts.vision

    @property
    def key(self) -> str:
        return str(self.path)

    def identity(self) -> Identity:
        """One stat of the file now; raises OSError when it is gone."""
        return identity_of(self.path)

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


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """("gguf?", file) for every candidate file, ("dir", path) for a transformers model
    directory (not descended into). In a Hugging Face cache, ``blobs/`` is skipped: the
    files are reached, with their real names, through ``snapshots/``."""
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:  # a symlink loop
            dirnames.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        here = Path(dirpath)
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
    """A file that looks like a model but cannot be served, and why."""

    path: Path
    reason: str


def scan(
    roots: Iterable[Path], cache: FactsCache | None = None
) -> tuple[list[Artifact], list[Unservable]]:
    """Every servable GGUF under the roots, and every GGUF-looking file that is not."""
    cache = cache or FactsCache(None)
    found: dict[str, Artifact] = {}
    rejected: list[Unservable] = []
    projectors: dict[Path, ProjectorShape] = {}
    for root in roots:
        if not root.is_dir():
            continue
        for kind, path in _walk(root):
            if kind == "dir":
                _add_folder(path, found, rejected)
                continue
            name = _model_name(path)
            if name is None or not has_gguf_magic(path):
                continue
            try:
                facts = cache.facts(path)
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
            found[name] = Artifact(name=name, path=path, facts=facts)
    cache.save()
    ggufs = {a.path: a for a in found.values() if a.format == "gguf"}
    for model, projector in pair_projectors(ggufs, projectors).items():
        found[ggufs[model].name] = replace(
            ggufs[model], mmproj=projector, projector=projectors[projector]
        )
    return sorted(found.values(), key=lambda a: a.name), rejected


def _add_folder(path: Path, found: dict[str, Artifact], rejected: list[Unservable]) -> None:
    """A transformers folder, sized from its headers, or the reason it cannot be served."""
    try:
        if is_snapshot_entry(path):
            return  # an older revision of a cached model: refs/main (or the newest) serves
        facts = folder_facts(path)
    except (BadModelDir, ValueError, RecursionError) as exc:  # never stops discovery
        rejected.append(Unservable(path, f"not a usable transformers model: {exc}"))
        return
    except OSError as exc:
        rejected.append(Unservable(path, f"not readable: {exc}"))
        return
    name = folder_name(path)
    if name in found:
        log.warning("%s: name %r already taken by %s", path, name, found[name].path)
        return
    found[name] = Artifact(name=name, path=facts.path, facts=facts, format=FOLDER_FORMAT)


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
        self, roots: tuple[Path, ...], aliases_file: Path, facts_cache: Path | None = None
    ) -> None:
        self.roots = roots
        self.aliases_file = aliases_file
        self._cache = FactsCache(facts_cache)
        self._by_name: dict[str, Artifact] = {}
        self._aliases: dict[str, str] = {}
        self.rejected: list[Unservable] = []
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
        artifacts, self.rejected = scan(self.roots, self._cache)
        self._by_name = {a.name: a for a in artifacts}
        # what `fitbox pull NAME` fetched answers to NAME; the aliases file may override
        self._aliases = {**builtin_aliases(), **read_aliases(self.aliases_file)}

    def artifacts(self) -> list[Artifact]:
        return list(self._by_name.values())

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
            known = ", ".join(sorted(self._by_name)[:10]) or "none"
            raise ModelNotFound(
                f"The model '{name}' does not exist on this box. Known models: {known}. "
                f"Put its GGUF under {os.pathsep.join(map(str, self.roots))} or run "
                f"'fitbox pull'.",
                param="model",
            )
        return artifact

"""What a box offers another box of one model: its files, jailed in the model's directory,
and their hashes (whole file and per fixed chunk), read in one pass.

The jail is an allow-list: a model offers its GGUF and that GGUF's sibling shards, by plain
file name, and nothing else. A name is refused before it is looked up when it is absolute,
holds a separator or ``..``, or is hidden; a file is offered only when its real path is in
the model's own directory, or is a Hugging Face cache blob (``models--*/blobs/``) that the
model's snapshot directory belongs to. Anything else (a symlink to ``/etc``, to another
model's directory) is refused with the reason.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fitbox.core.shard_names import shard_of

CHUNK_BYTES = 4 << 20  # what one chunksum covers: small enough that a cut loses little
READ_BLOCK = 1 << 20


class PathRefused(ValueError):
    """A requested path that is not one of the model's files, and why (for a person)."""

    def __init__(self, reason: str, *, outside: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.outside = outside  # False: a plain name that just is not one of the files


@dataclass(frozen=True)
class OfferedFile:
    name: str  # as the manifest lists it: a plain file name in the model's directory
    path: Path  # model directory / name (maybe a symlink)
    real: Path  # where the bytes are
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class FileHash:
    sha256: str
    chunk_bytes: int
    chunks: tuple[str, ...]
    seconds: float


def refuse_name(name: str) -> None:
    """Raise :class:`PathRefused` for a name that cannot be a plain file name here."""
    if not name:
        raise PathRefused("no path given: ask GET …/manifest for the model's files")
    if "\x00" in name:
        raise PathRefused("the path holds a NUL byte")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise PathRefused(f"{name!r} is an absolute path; name a file of the manifest")
    if "/" in name or "\\" in name:
        parts = re.split(r"[/\\]", name)
        if ".." in parts:
            raise PathRefused(f"{name!r} climbs out of the model's directory ('..')")
        raise PathRefused(
            f"{name!r} holds a path separator; the model's files are plain names in its directory"
        )
    if name in (".", ".."):
        raise PathRefused(f"{name!r} is a directory, not one of the model's files")
    if name.startswith("."):
        raise PathRefused(f"{name!r} is a hidden file; hidden files are never offered")


def _in_hf_blobs(real: Path, model_dir_real: Path) -> bool:
    """``real`` is a blob of the Hugging Face cache repo whose snapshot holds the model."""
    blobs = real.parent
    repo = blobs.parent
    return (
        blobs.name == "blobs"
        and repo.name.startswith("models--")
        and model_dir_real.is_relative_to(repo / "snapshots")
    )


def jailed(model_dir: Path, name: str) -> OfferedFile:
    """The file ``name`` in ``model_dir``, if its bytes live where the jail allows."""
    refuse_name(name)
    path = model_dir / name
    try:
        real = path.resolve(strict=True)
        dir_real = model_dir.resolve(strict=True)
        st = os.stat(real)
    except OSError as exc:  # the reason only: the box's own paths stay its own
        raise PathRefused(
            f"{name!r} cannot be read: {exc.strerror or 'error'}", outside=False
        ) from None
    except RuntimeError:  # a symlink loop
        raise PathRefused(f"{name!r} is a symlink loop") from None
    if real.parent != dir_real and not _in_hf_blobs(real, dir_real):
        raise PathRefused(
            f"{name!r} is a symlink out of the model's directory; only "
            "Hugging Face cache blobs may be linked"
        )
    if not os.path.isfile(real):
        raise PathRefused(f"{name!r} is not a regular file", outside=False)
    return OfferedFile(name, path, real, st.st_size, st.st_mtime_ns)


def model_files(artifact: Path) -> list[OfferedFile]:
    """The artifact's own files: the GGUF and, for a split GGUF, every shard beside it.
    A file the jail refuses is left out (the manifest never lists it)."""
    model_dir = artifact.parent
    offered = []
    for name in (path.name for path in set_files(artifact)):
        try:
            offered.append(jailed(model_dir, name))
        except PathRefused:
            continue
    return offered


def set_files(artifact: Path) -> list[Path]:
    """The files a model at ``artifact`` is: that GGUF, or for a split GGUF every shard its
    name counts, beside it, the first first (whether each exists is the caller's to see)."""
    shard = shard_of(artifact.name)
    if not shard:
        return [artifact]
    return [artifact.with_name(name) for name in shard.siblings()]


def missing_shards(names: list[str]) -> list[str]:
    """The shards of each split GGUF among ``names`` that ``names`` lacks: a split model is
    whole or it is no model (llama-server opens every shard of the set)."""
    missing: list[str] = []
    for name in names:
        shard = shard_of(name)
        if not shard:
            continue
        for sibling in shard.siblings():
            if sibling not in names and sibling not in missing:
                missing.append(sibling)
    return missing


def offered(artifact: Path, name: str) -> OfferedFile:
    """``name`` as a file of the model at ``artifact``, or :class:`PathRefused`."""
    refuse_name(name)
    files = {f.name: f for f in model_files(artifact)}
    if name not in files:
        jailed(artifact.parent, name)  # a symlink out says so, before "not one of them"
        raise PathRefused(
            f"{name!r} is not one of this model's files ({', '.join(files)})", outside=False
        )
    return files[name]


def hash_file(
    path: Path, chunk_bytes: int = CHUNK_BYTES, progress: Callable[[int], None] | None = None
) -> FileHash:
    """The whole file's sha256 and each chunk's, in one read."""
    started = time.monotonic()
    whole, chunks = hashlib.sha256(), []
    with path.open("rb") as f:
        while True:
            block = f.read(chunk_bytes)
            if not block:
                break
            whole.update(block)
            chunks.append(hashlib.sha256(block).hexdigest())
            if progress:
                progress(len(block))
    return FileHash(whole.hexdigest(), chunk_bytes, tuple(chunks), time.monotonic() - started)

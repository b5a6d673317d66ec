"""A weight file (or a split GGUF's shards, as one) copied between drives of one box, never
trusted unverified: the bytes are hashed as they are read (one pass), the source must still
be the file that was hashed (size and mtime) and match the sha256 kept for it, the copy
lands in ``NAME.part``, is fsynced once, and only then renamed into place (the directory
fsynced too)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from fitbox.models.transfer import CHUNK_BYTES

READ_BYTES = 16 << 20  # large reads: fewer syscalls; a multiple of the 4 MiB chunk


class CopyRefused(RuntimeError):
    """The copy was not kept (the source changed, or its bytes are not the ones hashed)."""


def part_of(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def copy_set_verified(
    files: Sequence[tuple[Path, Path, str | None]],
    progress: Callable[[int], None] | None = None,
) -> list[tuple[str, tuple[str, ...]]]:
    """Copy files that are one model together (a split GGUF's shards, the first first):
    (source, destination, the sha256 expected or None) each. Every file is copied to its
    ``.part``, verified and fsynced before any is renamed; then the renames, the first file
    last, so the model is named (the catalog lists a split GGUF by its first shard) only
    once every shard is in place. No destination may exist. On any failure nothing is left
    behind: no ``.part``, no renamed shard. Returns each file's (sha256, chunk sha256s)."""
    for _src, dest, _expected in files:
        if dest.exists():
            raise CopyRefused(f"{dest} exists already; nothing was copied")
    made: list[Path] = []
    try:
        hashed = []
        for src, dest, expected in files:
            dest.parent.mkdir(parents=True, exist_ok=True)
            made.append(part_of(dest))
            hashed.append(_copy_to_part(src, part_of(dest), expected, progress))
        for _src, dest, _expected in reversed(files):
            os.replace(part_of(dest), dest)
            made.append(dest)
    except BaseException:
        for path in made:
            path.unlink(missing_ok=True)
        raise
    for parent in dict.fromkeys(dest.parent for _src, dest, _expected in files):
        sync_dir(parent)
    return hashed


def _copy_to_part(
    src: Path, part: Path, expected_sha256: str | None, progress: Callable[[int], None] | None
) -> tuple[str, tuple[str, ...]]:
    """``src`` copied to ``part``, hashed as it is read, fsynced, and checked: still the
    file it was (size and mtime) and, if given, the expected sha256."""
    before = os.stat(src)
    whole, chunks = hashlib.sha256(), []
    with src.open("rb") as reader, part.open("wb") as out:
        while block := reader.read(READ_BYTES):
            out.write(block)
            whole.update(block)
            view = memoryview(block)
            for at in range(0, len(view), CHUNK_BYTES):
                chunks.append(hashlib.sha256(view[at : at + CHUNK_BYTES]).hexdigest())
            if progress:
                progress(len(block))
        out.flush()
        os.fsync(out.fileno())
    after = os.stat(src)
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise CopyRefused(f"{src} changed while it was copied; the copy was dropped")
    digest = whole.hexdigest()
    if expected_sha256 is not None and digest != expected_sha256:
        raise CopyRefused(
            f"{src} read as sha256 {digest}, not the {expected_sha256} kept "
            "for it (a damaged drive?); the copy was dropped"
        )
    return digest, tuple(chunks)


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

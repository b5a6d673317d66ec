"""Task calls' outputs (speech, transcripts, images) kept in the artifact dir for a while.

Each output is written as it is sent (``Output``: hashed and counted on the way, so its
sha256 and bytes go on the call row), named by its call. The dir is pruned whenever an
output is added: files older than ``FITBOX_ARTIFACT_MAX_AGE``, then the oldest until the
rest fit ``FITBOX_ARTIFACT_MAX``. A route that hands out a URL to an output (images) names
it by 128 random bits (``unguessable``: the name is the capability the URL carries) and reads
it back by that name (``path_of``) while it is kept and younger than the age limit.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from pathlib import Path
from typing import IO, Any

_NAME = re.compile(r"^[0-9a-z-]+\.[0-9a-z]+$")


class Output:
    """One output on its way out: hashed, counted, and written to its artifact file."""

    def __init__(self, path: Path | None, name: str) -> None:
        self.name = name
        self.path = path
        self.size = 0
        self.digest = hashlib.sha256()
        self.sink: IO[bytes] | None = path.open("wb") if path is not None else None

    def write(self, data: bytes) -> None:
        self.size += len(data)
        self.digest.update(data)
        if self.sink is not None:
            self.sink.write(data)

    def close(self) -> dict[str, Any]:
        """The call row's record of it (never its content)."""
        if self.sink is not None:
            self.sink.close()
            self.sink = None
        return {"role": "output", "name": self.name, "bytes": self.size, "sha256": self.sha256}

    @property
    def sha256(self) -> str:
        return self.digest.hexdigest()


class Artifacts:
    def __init__(self, root: Path, max_age: float, max_bytes: int) -> None:
        self.root, self.max_age, self.max_bytes = root, max_age, max_bytes

    def output(self, call_id: int, ext: str) -> Output:
        """A new output of call ``call_id`` (its file ``call-<id>.<ext>``); the dir is
        pruned first. A dir that cannot be written keeps nothing: the output still goes."""
        return self._opened(f"call-{call_id}.{ext}")

    def unguessable(self, ext: str) -> Output:
        """A new output named by 128 random bits (``image-<32 hex>.<ext>``), for a URL."""
        return self._opened(f"image-{secrets.token_hex(16)}.{ext}")

    def _opened(self, name: str) -> Output:
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.prune()
            return Output(self.root / name, name)
        except OSError:
            return Output(None, name)

    def path_of(self, name: str, now: float | None = None) -> Path | None:
        """A kept output by its name; None when it is not (or no longer) kept: an output
        past its age is gone, whether or not a prune has removed its file yet."""
        if not _NAME.match(name):
            return None
        path = self.root / name
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        if (time.time() if now is None else now) - mtime > self.max_age:
            path.unlink(missing_ok=True)
            return None
        return path if path.is_file() else None

    def prune(self, now: float | None = None) -> list[Path]:
        """Remove outputs past their age, then the oldest beyond the size budget."""
        now = time.time() if now is None else now
        kept: list[tuple[float, int, Path]] = []
        removed: list[Path] = []
        for entry in os.scandir(self.root):
            try:
                stat = entry.stat()
            except OSError:
                continue
            kept.append((stat.st_mtime, stat.st_size, Path(entry.path)))
        kept.sort()
        total = sum(size for _, size, _ in kept)
        for mtime, size, path in kept:
            if now - mtime <= self.max_age and total <= self.max_bytes:
                continue
            path.unlink(missing_ok=True)
            removed.append(path)
            total -= size
        return removed

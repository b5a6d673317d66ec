"""The engine children's log files: one per launch (``{model}-{port}.log``, its older half
in ``.1`` past ``MAX_LOG_BYTES``, engines/child.py), listed and read for admins
(``GET /v1/logs``), and pruned by age and total size before each launch, oldest first, never
a running child's.

A name read over HTTP is a file name this directory holds, matched by its pattern, never a
path: nothing outside the log directory can be named."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME = re.compile(r"^(?P<model>[A-Za-z0-9._-]+)-(?P<port>\d{1,5})\.log(?:\.1)?$")
READ_MAX = 4 << 20  # one answer's bytes at most: a client follows a long log by its offset


@dataclass(frozen=True)
class LogFile:
    name: str
    model: str
    size: int
    modified: float
    running: bool

    def row(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "bytes": self.size,
            "modified_at": self.modified,
            "running": self.running,
        }


@dataclass(frozen=True)
class LogPiece:
    """Bytes of a log from ``start``; ``end`` is where a follower asks next."""

    text: bytes
    start: int
    end: int
    size: int


class ChildLogs:
    def __init__(self, directory: Path, max_age_s: float, max_bytes: int) -> None:
        self.directory, self.max_age_s, self.max_bytes = directory, max_age_s, max_bytes

    def files(self, running: Collection[Path] = ()) -> list[LogFile]:
        """Every child log here, newest first; ``running`` are the live children's logs."""
        live = {p.name for p in running} | {f"{p.name}.1" for p in running}
        found = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.directory):
                matched = NAME.match(entry.name)
                if matched is None or not entry.is_file(follow_symlinks=False):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    stat = entry.stat(follow_symlinks=False)
                    found.append(
                        LogFile(
                            entry.name,
                            matched["model"],
                            stat.st_size,
                            stat.st_mtime,
                            entry.name in live,
                        )
                    )
        return sorted(found, key=lambda f: (-f.modified, f.name))

    def prune(self, running: Collection[Path] = (), now: float | None = None) -> list[str]:
        """Remove logs older than ``max_age_s``, then the oldest until the rest fit in
        ``max_bytes``; a running child's are kept whatever they hold. The names removed."""
        now = time.time() if now is None else now
        found = self.files(running)
        total = sum(log.size for log in found if log.running)  # kept whatever they hold
        removed, full = [], False
        for log in (log for log in found if not log.running):  # newest first: they stay
            full = full or total + log.size > self.max_bytes  # and every older one goes
            if full or now - log.modified > self.max_age_s:
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / log.name).unlink()
                removed.append(log.name)
            else:
                total += log.size
        return removed

    def path_of(self, name: str) -> Path | None:
        """The log file ``name`` names here, or None: a name that is not a log file's (a
        path, ``..``, another file) names nothing."""
        if NAME.match(name) is None:
            return None
        path = self.directory / name
        return path if path.is_file() and not path.is_symlink() else None

    def read(self, name: str, offset: int | None, tail_lines: int) -> LogPiece | None:
        """From byte ``offset`` (a follower's next read), or the last ``tail_lines`` lines;
        at most ``READ_MAX`` bytes. None: no such log."""
        path = self.path_of(name)
        if path is None:
            return None
        with path.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            if offset is None:
                start = _tail_start(file, size, tail_lines)
            else:
                start = size if offset > size else offset  # a rotated file starts again
            file.seek(start)
            text = file.read(min(size - start, READ_MAX))
        return LogPiece(text, start, start + len(text), size)


def _tail_start(file: Any, size: int, lines: int) -> int:
    """Where the last ``lines`` lines of ``file`` begin (read backwards, a block at a time)."""
    block, start, seen = 64 << 10, size, 0
    while start > 0:
        start = max(start - block, 0)
        file.seek(start)
        chunk = file.read(min(block, size - start))
        seen += chunk.count(b"\n")
        if seen > lines:
            excess = seen - lines - 1
            at = -1
            for _ in range(excess + 1):
                at = chunk.index(b"\n", at + 1)
            return start + at + 1
    return 0

"""The staging file of a pull, landed piece by piece off the reading thread
(models/box_pull.py reads the network and checks each chunk; this keeps the file, the whole
file's sha256, and the mark of the last verified chunk)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import mmap
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from fitbox.models.pull import PullError


class Landing:
    """The staging file's bytes, landed in order on threads of their own: each piece
    written (``pwrite``, on one) and fed to the whole file's sha256 (on the other) from the
    buffer it was read into, while the next piece is read (all let go of the GIL, so the
    network, the chunk's check, the disk and the whole hash overlap; one thread doing both
    was the slow stage, 57-67 % of curl against 67-81 % in alternating bench runs).
    Pieces are small enough to still be in the CPU's cache when they are written and
    hashed: writing each 4 MiB chunk once it had verified cost 3 to 7 times the CPU of
    these writes (the bytes came back from memory).

    So the bytes of the chunk being received are written before it verifies; they are not
    trusted: ``verified`` marks the end of a chunk that matched (the offset and the whole
    hash's state there), ``rewind`` cuts the file back to the last mark and restores that
    state. A ``.part`` left by a crash is checked chunk by chunk before reuse, so an
    unverified tail in it is never kept. ``finish`` waits for the last write and fsyncs
    once.

    Pieces are written with ``O_DIRECT`` (from page-aligned buffers, at aligned offsets),
    straight to the drive: on this VM, 375 MiB written through the page cache in 64 KiB
    pwrites took 0.44-0.48 s and 0.18 s of CPU before its fsync, and direct 1 MiB writes
    0.22-0.27 s and 0.03 s of CPU, fsync included; nothing is left for the fsync to write
    back and the page cache is not filled with a file no one reads yet. The file's
    unaligned tail, and every piece where the filesystem refuses ``O_DIRECT`` (tmpfs
    before Linux 6.6, some FUSE), go through the page cache, their write-back started
    every 32 MiB (``sync_file_range``, not waited for)."""

    PIECE = 1 << 20  # the L2 cache of this class of CPU; 256 KiB pieces cost more CPU
    RING = 4  # pieces read and not yet landed, at most
    # each pwrite's size: on this Linux 6.18 VM, writes of 128 KiB and more were at times
    # 10x the CPU (1.5 s per 384 MiB, in copy_folio_from_iter_atomic: the page cache's large
    # folios coming from memory the host had taken back, it seems); 64 KiB stayed at
    # 0.14-0.18 s in a scratch benchmark of alternating sizes and beat 16 KiB in pulls, but
    # one pull in a fresh process still paid 1.2 s: rarer, not gone
    WRITE_BYTES = 64 << 10

    def __init__(self, fd: int, part: Path) -> None:
        self._part, self._fd = part, fd
        self._digest = hashlib.sha256()
        self._mark = (0, self._digest.copy())  # the end of the last verified chunk
        self._at = 0  # where the next piece lands (the reader's side)
        # one thread writes, one feeds the whole hash: each piece is the same buffer for both
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="pull-write")
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="pull-hash")
        # page-aligned, as O_DIRECT needs (an anonymous mmap starts on a page)
        self._buffers = [mmap.mmap(-1, self.PIECE) for _ in range(self.RING)]
        self._direct = _open_direct(part)  # None: every piece through the page cache
        self._landing: list[tuple[Future[None], ...]] = [()] * self.RING
        self._next = 0
        self._unsynced_from: int | None = None  # the writer's, and rewind's once drained

    def buffer(self) -> memoryview:
        """The next piece's buffer, once its last piece landed (a write error is raised
        here); the piece read into it is handed back with ``write`` or ``hash_only``."""
        landing, self._landing[self._next] = self._landing[self._next], ()
        for step in landing:
            step.result()
        return memoryview(self._buffers[self._next])

    def write(self, piece: memoryview) -> None:
        """Bytes read into ``buffer()``: written at the next offset and hashed."""
        self._hand(piece, True)

    def hash_only(self, piece: memoryview) -> None:
        """Bytes read into ``buffer()`` from the file itself (a resumed ``.part``)."""
        self._hand(piece, False)

    def _hand(self, piece: memoryview, write: bool) -> None:
        if not piece:
            return
        hashed = self._hasher.submit(self._digest_update, piece)
        if write:
            self._landing[self._next] = (self._writer.submit(self._land, piece, self._at), hashed)
        else:
            self._landing[self._next] = (hashed,)
        self._at += len(piece)
        self._next = (self._next + 1) % self.RING

    def _land(self, piece: memoryview, at: int) -> None:
        try:
            if self._direct is not None and at % ALIGN == 0:
                done = self._write_direct(piece[: len(piece) - len(piece) % ALIGN], at)
                piece, at = piece[done:], at + done
            if piece:
                self._write_buffered(piece, at)
        except OSError as exc:  # a full or failing disk: no cut, no retry helps
            raise PullError(f"could not write {self._part}: {exc}") from exc

    def _write_direct(self, piece: memoryview, at: int) -> int:
        """Write ``piece`` (aligned) with O_DIRECT; how much was (all, but where the
        filesystem refused O_DIRECT: then never again for this file)."""
        written = 0
        while written < len(piece) and self._direct is not None:
            try:
                step = os.pwrite(self._direct, piece[written:], at + written)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self._direct)  # the filesystem takes no O_DIRECT after all
                self._direct = None
                break
            written += step
            if not step or step % ALIGN:  # short, off alignment: the rest is buffered
                break
        return written

    def _write_buffered(self, piece: memoryview, at: int) -> None:
        written = 0
        while written < len(piece):
            step = piece[written : written + self.WRITE_BYTES]
            written += os.pwrite(self._fd, step, at + written)
        if self._unsynced_from is None:
            self._unsynced_from = at
        if at + len(piece) - self._unsynced_from >= WRITE_BACK_BYTES:
            start_write_back(self._fd, self._unsynced_from, at + len(piece))
            self._unsynced_from = None

    def _digest_update(self, piece: memoryview) -> None:
        self._digest.update(piece)  # the hasher thread's: rewind swaps it once drained

    def read_at(self, view: memoryview, at: int) -> int:
        """Fill ``view`` from the staging file at ``at``; fewer bytes only at its end."""
        filled = 0
        while filled < len(view):
            got = os.preadv(self._fd, [view[filled:]], at + filled)
            if not got:
                break
            filled += got
        return filled

    def verified(self) -> None:
        """Everything handed over so far is a chunk that matched: keep it."""
        at = self._at
        self._hasher.submit(self._set_mark, at)  # after the chunk's last piece is hashed

    def _set_mark(self, at: int) -> None:
        self._mark = (at, self._digest.copy())

    def drain(self) -> None:
        """Wait for every piece handed over (a write error is raised here)."""
        for worker in (self._writer, self._hasher):
            worker.submit(lambda: None).result()
        for index, landing in enumerate(self._landing):
            self._landing[index] = ()
            for step in landing:
                step.result()

    def rewind(self) -> None:
        """Throw away what came after the last verified chunk: the file cut back there,
        the whole hash as it was there, the next piece landing there."""
        self.drain()
        at, state = self._mark
        self._digest, self._at = state.copy(), at
        if self._unsynced_from is not None and self._unsynced_from >= at:
            self._unsynced_from = None
        try:
            os.ftruncate(self._fd, at)
        except OSError as exc:
            raise PullError(f"could not cut {self._part} back to {at} bytes: {exc}") from exc

    def finish(self) -> str:
        """The whole file's sha256, once every chunk landed and the file is on the disk."""
        self.drain()
        if self._at != self._mark[0]:  # a bug here, never the network: refuse the file
            raise PullError(f"{self._part}: {self._at - self._mark[0]} bytes never verified")
        os.fsync(self._fd)
        return self._digest.hexdigest()

    def __enter__(self) -> Landing:
        return self

    def __exit__(self, *_: object) -> None:
        self._writer.shutdown(wait=True)
        self._hasher.shutdown(wait=True)
        if self._direct is not None:
            os.close(self._direct)
        for buffer in self._buffers:
            with contextlib.suppress(BufferError):  # a view still held: the GC frees it
                buffer.close()


def _open_direct(part: Path) -> int | None:
    """A second descriptor of the staging file that writes around the page cache, or None
    where the filesystem (or the platform) has no O_DIRECT."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(part, os.O_WRONLY | flag)
    except OSError:
        return None


def _sync_file_range() -> Callable[[int, int, int], None] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]

    def start(fd: int, offset: int, count: int) -> None:
        call(fd, offset, count, SYNC_FILE_RANGE_WRITE)  # a failure only costs the overlap

    return start


ALIGN = 4096  # O_DIRECT's offsets and lengths: the largest logical block size in common use
SYNC_FILE_RANGE_WRITE = 2  # start write-back of dirty pages in the range; do not wait
WRITE_BACK_BYTES = 32 << 20
_START_WRITE_BACK = _sync_file_range()


def start_write_back(fd: int, start: int, end: int) -> None:
    """Start writing ``[start, end)`` of ``fd`` back to the disk without waiting, so the
    final fsync has little left to do (Linux; elsewhere the fsync does it all)."""
    if _START_WRITE_BACK is not None:
        _START_WRITE_BACK(fd, start, end - start)

"""One engine child process: launch in its own process group, readiness, the stop ladder.

The child dies with fitbox: it runs in its own session (so a signal reaches its whole
group) and asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG on Linux),
through util-linux's setpriv where it runs (fitbox is then vforked, not forked: a
``preexec_fn`` forks the whole heap, ~85 ms a launch; see :func:`launch_argv`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import BinaryIO

from fitbox.engines.http1 import EngineConnectionError, EnginePool

# Readiness is seen from the child's own output: every chunk it prints wakes one /health
# check (llama-server prints "model loaded", "listening" and "all slots are idle" as it
# turns ready). The poll is only the backstop for an engine that turns ready silently.
READY_BACKSTOP_S = 0.05
READY_AFTER_OUTPUT_S = (0.002, 0.01)  # re-checks after the last chunk, then the backstop
TAIL_LINES = 30
# Once a child is ready its output is only kept (the file, the tail), so it is read in
# batches: llama-server at -lv 4 prints ~31 lines a 1-token chat, each written on its own,
# and a pipe read as it comes is a wake-up of the event loop that serves calls, with a read
# and a write, per line (~40 a call, 0.4-0.5 ms of its CPU, bench/hot_path.py). Between
# batches nobody watches the pipe: the kernel holds the lines (the pipe is widened to
# PIPE_BYTES where it can be; 64 KiB otherwise, far more than a child prints in the pause),
# and llama.cpp's log thread, not its server, would be the one to wait on a full pipe.
SETTLED_READ_PAUSE_S = 0.05
PIPE_BYTES = 1 << 20
READ_AT_ONCE = 4 * PIPE_BYTES  # one wake-up's reads, at most
TAIL_BYTES = 64 * 1024  # the end of the output kept in memory: what read_tail reads of a file
MAX_LOG_BYTES = 16 * 1024 * 1024  # per child log file; one rotated copy is kept
MAX_LOAD_SECTION = 4 * 1024 * 1024


class ChildExited(RuntimeError):
    def __init__(self, returncode: int | None, tail: list[str]) -> None:
        super().__init__(f"engine exited with code {returncode}")
        self.returncode = returncode
        self.tail = tail


class ChildTimeout(RuntimeError):
    def __init__(self, seconds: float, tail: list[str]) -> None:
        super().__init__(f"engine not ready after {seconds:.0f} s")
        self.tail = tail


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@functools.cache
def launchers() -> tuple[str, str] | None:
    """util-linux's setpriv and taskset, when both run here: the parent-death signal and the
    claim's affinity are then set by them, between exec and exec, so fitbox itself is
    vforked. A ``preexec_fn`` makes Python fork the whole process instead: measured with a
    150 MB heap, 82-100 ms per launch against 0.5-2 ms (the chain of two small execs adds a
    few ms), paid by every load and every swap."""
    setpriv, taskset = shutil.which("setpriv"), shutil.which("taskset")
    if not sys.platform.startswith("linux") or setpriv is None or taskset is None:
        return None
    try:  # an older setpriv has no --pdeathsig
        done = subprocess.run(
            [setpriv, "--pdeathsig", "KILL", taskset, "-c", "0", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (setpriv, taskset) if done.returncode == 0 else None


def launch_argv(argv: list[str], cpus: frozenset[int]) -> list[str] | None:
    """``argv`` run through setpriv (SIGKILL when fitbox dies) and taskset (the claim's CPUs),
    each exec'ing the next, so the pid and the process group stay the engine's; None where
    they cannot run (the child is then set up by a preexec_fn). The first call checks they
    run (one small exec): the supervisor makes it at start, off any load's clock."""
    tools = launchers()
    if tools is None:
        return None
    setpriv, taskset = tools
    pinned = [taskset, "-c", ",".join(str(cpu) for cpu in sorted(cpus))] if cpus else []
    return [setpriv, "--pdeathsig", "KILL", *pinned, *argv]


def die_with_parent(cpus: frozenset[int] = frozenset()) -> None:
    """Runs in the child between fork and exec: SIGKILL when fitbox dies, and the CPU claim
    as its affinity (every thread it starts inherits it)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if cpus:
            os.sched_setaffinity(0, cpus)


def read_tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return list(deque((ln for ln in text.splitlines() if ln.strip()), maxlen=lines))


def _open_log(path: Path) -> BinaryIO:
    """A child's log, owner-only (at -lv 4 it holds paths, ports, prompts), in an owner-only
    folder; a folder an older fitbox made readable by others is narrowed."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(path.parent.stat().st_mode)
        if mode & 0o077:
            path.parent.chmod(mode & 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "ab", buffering=0)


class _LogPump:
    """Copies the child's output into its log file, rotating it past ``MAX_LOG_BYTES``
    (one ``.1`` kept), so an engine at -lv 4 cannot fill the disk. The load section (all
    output before readiness) stays readable by :meth:`Child.load_log`, and the last
    ``TAIL_BYTES`` by :meth:`Child.tail`, from memory: a drive that refuses the file (full,
    gone) loses log lines, never the child, its load or the reason it failed."""

    def __init__(self, path: Path, header: bytes) -> None:
        self.path = path
        self.file: BinaryIO | None = None
        self.written = 0
        self.load_section = bytearray(header)
        self.recent = bytearray()
        self.loading = True
        self.printed = asyncio.Event()  # set by every chunk; the readiness wait clears it
        self.hurry = asyncio.Event()  # the child is stopping: no more pauses between reads
        self.detached = False  # handed over to a new image (a re-exec): its pipe stays open
        self._write(header)

    async def run(self, fd: int) -> None:
        """Copy what the child prints to ``fd`` (the pipe's read end, non-blocking; closed
        here) until the pipe closes: while it loads, each chunk as it comes; once it is
        ready, all that gathered, at most once per ``SETTLED_READ_PAUSE_S``."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await _readable(loop, fd)
                data, closed = _read_all(fd)
                if data:
                    if self.loading and len(self.load_section) < MAX_LOAD_SECTION:
                        self.load_section += data
                    self._write(data)
                    self.printed.set()
                if closed:
                    break
                if not self.loading:  # ready: let the next lines gather in the pipe
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(SETTLED_READ_PAUSE_S):
                            await self.hurry.wait()  # set by a stop: read the rest now
        finally:
            if not self.detached:
                os.close(fd)
            self.printed.set()  # the pipe closed: the child is exiting
            if self.file is not None:
                with contextlib.suppress(OSError):
                    self.file.close()

    def _write(self, data: bytes) -> None:
        self.recent += data
        del self.recent[:-TAIL_BYTES]
        try:
            if self.file is None:
                self.file = _open_log(self.path)
            if self.written + len(data) > MAX_LOG_BYTES:
                self.file.close()
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self.file = _open_log(self.path)
                self.written = 0
            self.file.write(data)
            self.written += len(data)
        except OSError:  # a full disk loses log lines, never the child or the call
            pass

    def tail(self, lines: int) -> list[str]:
        text = bytes(self.recent).decode("utf-8", errors="replace")
        return list(deque((ln for ln in text.splitlines() if ln.strip()), maxlen=lines))


async def _readable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Until ``fd`` has something to read (or is closed); nobody watches it after."""
    ready: asyncio.Future[None] = loop.create_future()

    def seen() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, seen)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _read_all(fd: int) -> tuple[bytes, bool]:
    """What the pipe holds now (at most ``READ_AT_ONCE``: a child printing as fast as this
    reads cannot hold the loop), and whether its write end is closed (all read)."""
    pieces: list[bytes] = []
    taken = 0
    while taken < READ_AT_ONCE:
        try:
            piece = os.read(fd, PIPE_BYTES)
        except BlockingIOError:
            break
        if not piece:
            return b"".join(pieces), True
        pieces.append(piece)
        taken += len(piece)
    return b"".join(pieces), False


def _log_pipe() -> tuple[int, int]:
    """A pipe for the child's output: (read end, non-blocking; write end, for the child).
    Both ends are non-inheritable (PEP 446), so no other child fitbox starts holds them."""
    read_end, write_end = os.pipe()
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        with contextlib.suppress(OSError):  # past /proc/sys/fs/pipe-max-size: keep 64 KiB
            fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    os.set_blocking(read_end, False)
    return read_end, write_end


class Child:
    def __init__(
        self,
        argv: list[str],
        port: int,
        log_path: Path,
        cpus: frozenset[int] = frozenset(),
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = argv
        self.cpus = cpus
        self.env = env or {}
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"
        self.pool = EnginePool("127.0.0.1", port)
        self.proc: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self._pump: _LogPump | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._pipe_fd: int | None = None  # the read end of its output pipe

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def tail(self, lines: int = TAIL_LINES) -> list[str]:
        if self._pump is not None:  # what it printed, whether or not the drive kept it
            return self._pump.tail(lines)
        return read_tail(self.log_path, lines)

    def load_log(self) -> str:
        """Everything the child printed until it was ready (its buffer sizes, at -lv 4)."""
        return bytes(self._pump.load_section).decode("utf-8", "replace") if self._pump else ""

    async def start(self) -> None:
        self._pump = _LogPump(self.log_path, f"$ {' '.join(self.argv)}\n".encode())
        self.started_at = time.monotonic()
        chained = launch_argv(self.argv, self.cpus)
        # the output pipe is fitbox's own, not asyncio's: its read end is watched only
        # while the pump asks (asyncio's pipe transport reads every line as it comes)
        read_end, write_end = _log_pipe()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *(chained or self.argv),
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
                # prctl + affinity in the forked child, where setpriv and taskset cannot run
                preexec_fn=None if chained else functools.partial(die_with_parent, self.cpus),
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)  # the child's copy is its own: EOF comes when it exits
        self._pipe_fd = read_end
        self._pump_task = asyncio.get_running_loop().create_task(self._pump.run(read_end))

    async def wait_exit(self) -> int | None:
        """Until the child exits; its exit code."""
        assert self.proc is not None
        return await self.proc.wait()

    def hand_over(self) -> int | None:
        """Before a re-exec keeps it running: the read end of its output pipe, left open and
        made inheritable (what it prints meanwhile waits in the pipe) for the new image to
        read on; None when there is none to hand."""
        pump, fd = self._pump, self._pipe_fd
        if pump is None or fd is None or self._pump_task is None or self._pump_task.done():
            return None
        pump.detached = True
        self._pump_task.cancel()
        os.set_inheritable(fd, True)
        return fd

    async def wait_ready(self, limit_s: float) -> float:
        """Seconds from launch until /health answers 200, checked each time the child prints
        (and shortly after its last chunk, then every ``READY_BACKSTOP_S``). Raises if the
        child dies or the limit passes."""
        assert self.proc is not None
        deadline = time.monotonic() + limit_s
        pauses = iter(READY_AFTER_OUTPUT_S)
        while True:
            if self.proc.returncode is not None:
                if self._pump_task is not None:  # let the last lines reach the file first
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(2):
                            await asyncio.shield(self._pump_task)
                raise ChildExited(self.proc.returncode, self.tail())
            with contextlib.suppress(EngineConnectionError, TimeoutError):
                async with asyncio.timeout(1.0):
                    status, _ = await self.pool.get("/health")
                if status == 200:
                    if self._pump is not None:
                        self._pump.loading = False
                    return time.monotonic() - self.started_at
            if time.monotonic() > deadline:
                raise ChildTimeout(limit_s, self.tail())
            if self._pump is None:
                await asyncio.sleep(READY_BACKSTOP_S)
                continue
            printed = self._pump.printed
            if printed.is_set():
                printed.clear()
                pauses = iter(READY_AFTER_OUTPUT_S)  # new output: watch closely again
                continue
            pause = next(pauses, READY_BACKSTOP_S)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await printed.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def stop(self, grace: float) -> int | None:
        """SIGTERM the group, wait ``grace``, SIGKILL the group, reap. Returns the exit code.
        ``grace`` 0: SIGKILL at once (an idle engine has nothing to finish; llama-server takes
        60-100 ms to exit on SIGTERM, bench/swap.py)."""
        if self.proc is None:
            return None
        if self.proc.returncode is None and grace <= 0:
            self._signal_group(signal.SIGKILL)  # nothing to finish: no grace to wait out
            await self.proc.wait()
        elif self.proc.returncode is None:
            self._signal_group(signal.SIGTERM)
            self._signal_group(signal.SIGCONT)  # a stopped (hung) child must run to see it
            try:
                async with asyncio.timeout(grace):
                    await self.proc.wait()
            except TimeoutError:
                self._signal_group(signal.SIGKILL)
                await self.proc.wait()
        # the leader is gone; make sure nothing it forked lingers in the group
        self._signal_group(signal.SIGKILL)
        await self.pool.aclose()
        if self._pump is not None:
            self._pump.hurry.set()
        if self._pump_task is not None:  # the pipe is closed now: the pump drains and ends
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):  # past it the pump is cancelled
                    await self._pump_task
        return self.proc.returncode

    def kill_now(self) -> None:
        """Last resort at interpreter exit: no awaiting, just SIGKILL the group."""
        if self.proc is not None and self.proc.returncode is None:
            self._signal_group(signal.SIGKILL)

"""An engine child this fitbox did not launch in this image: handed over across a re-exec
(SIGHUP, still this process's child) or left running by an earlier fitbox (a crash where
PR_SET_PDEATHSIG could not act). It is watched through a pidfd, stopped by its process
group like any child, and its output is copied on from the pipe the old image handed over
(none after a crash: the engine's writes then go nowhere, which llama-server survives).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import psutil

from fitbox.engines.child import Child, _LogPump
from fitbox.engines.orphans import START_TIME_SLACK_S

POLL_S = 1.0  # where no pidfd can be opened: how often its exit is looked for


class AdoptedChild(Child):
    def __init__(
        self,
        argv: list[str],
        port: int,
        log_path: Path,
        pid: int,
        create_time: float,
        pipe_fd: int | None = None,
    ) -> None:
        super().__init__(argv, port, log_path)
        self._pid, self._create_time, self._pipe_fd = pid, create_time, pipe_fd
        self._code: int | None = None
        self._exited = False
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def alive(self) -> bool:
        if self._exited:
            return False
        try:
            process = psutil.Process(self._pid)
            same = abs(process.create_time() - self._create_time) <= START_TIME_SLACK_S
            return same and process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    async def start(self) -> None:
        """Nothing is launched: the output pipe the old image handed over is read on."""
        if self._pipe_fd is None:
            return
        os.set_blocking(self._pipe_fd, False)
        os.set_inheritable(self._pipe_fd, False)
        self._pump = _LogPump(self.log_path, b"")
        self._pump.loading = False
        self._pump_task = asyncio.get_running_loop().create_task(self._pump.run(self._pipe_fd))

    async def wait_exit(self) -> int | None:
        """Until the process ends; its exit code where it is this process's own child."""
        if not self._exited:
            await self._until_gone()
            self._exited = True
            self._code = self._reap()
        return self._code

    async def _until_gone(self) -> None:
        try:
            fd = os.pidfd_open(self._pid)
        except (AttributeError, OSError):  # no pidfd here (or it is gone already)
            while True:
                if not self.alive:
                    return
                await asyncio.sleep(POLL_S)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def exited() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(fd, exited)
        try:
            if self.alive:
                await done
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    def _reap(self) -> int | None:
        """The exit code of our own child (a re-exec keeps it ours); None for another's."""
        try:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:
            return None
        return os.waitstatus_to_exitcode(status) if pid else None

    def _kill_group(self, sig: signal.Signals) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pid, sig)

    async def stop(self, grace: float) -> int | None:
        """The same ladder as a child launched here: SIGTERM, ``grace``, SIGKILL."""
        if not self._exited:
            self._kill_group(signal.SIGKILL if grace <= 0 else signal.SIGTERM)
            try:
                async with asyncio.timeout(max(grace, 0) + 0.5):
                    await self.wait_exit()
            except TimeoutError:
                self._kill_group(signal.SIGKILL)
                await self.wait_exit()
        await self.pool.aclose()
        if self._pump is not None:
            self._pump.hurry.set()
        if self._pump_task is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._pump_task
        return self._code

    def kill_now(self) -> None:
        self._kill_group(signal.SIGKILL)

"""uvicorn's server, woken once a second instead of ten times while nothing happens.

uvicorn's ``main_loop`` sleeps 0.1 s at a time to notice ``should_exit`` and to renew the
``Date`` header once a second. Those ten wake-ups a second are fitbox's own idle work while
an engine computes beside it; on a 2-core box each takes the GIL and a core from llama.cpp,
whose threads then wait for each other at their barriers. Here the loop waits on an event
that ``should_exit`` sets (from a signal handler or another thread alike), and ticks once a
second for the header, as uvicorn's every tenth tick did.

A listening socket that cannot accept (no file descriptor left: EMFILE) is retried by
asyncio many times a second, each failure a traceback in the log; here they are logged once
a minute, with how many there were (``Hushed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import uvicorn

TICK_S = 1.0  # uvicorn renews the Date header on every tenth 0.1 s tick: once a second
TICKS_PER_RENEWAL = 10  # uvicorn's on_tick renews the headers when counter % 10 == 0
COUNTER_WRAP = 864_000  # uvicorn's own counter wraps here
ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's message, each attempt
HUSH_S = 60.0

log = logging.getLogger("fitbox.server")


class Hushed:
    """A warning that may come thousands of times a second, logged once per ``every_s``
    with how many came since."""

    def __init__(self, logger: logging.Logger, every_s: float) -> None:
        self.logger, self.every_s = logger, every_s
        self.last: float | None = None
        self.since = 0

    def warn(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        self.since += 1
        if self.last is not None and now - self.last < self.every_s:
            return
        if self.last is not None:
            message += f" ({self.since} times in the last {now - self.last:.0f} s)"
        self.logger.warning(message, *args)
        self.last, self.since = now, 0


def hush_accept_failures(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio's accept failures (EMFILE, ENFILE…) once a minute; every other error as the
    loop's default handler logs it."""
    hushed = Hushed(log, HUSH_S)

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == ACCEPT_FAILED:
            hushed.warn("cannot accept connections: %s", context.get("exception"))
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


class QuietServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose main loop sleeps until it must exit, or a second passes."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exiting = False
        super().__init__(config)

    @property  # uvicorn's is a plain attribute, set in its __init__
    def should_exit(self) -> bool:
        return self._exiting

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exiting = value
        loop = self._loop
        if value and loop is not None:
            # thread-safe and signal-safe: a signal handler runs between two of the loop's
            # own bytecodes, as asyncio's own signal handling wakes it the same way
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing waits
                loop.call_soon_threadsafe(self._exit.set)

    def handle_exit(self, sig: int, frame: Any) -> None:
        """A stop signal: the app's word that it is leaving (``app.state.leaving``,
        server/views/leaving.py) first, so its endless streams end now, not at the grace
        period's end (uvicorn waits for open responses before the app's shutdown runs)."""
        leaving = getattr(getattr(self.config.app, "state", None), "leaving", None)
        if leaving is not None:
            leaving.now()
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[Any] | None = None) -> None:
        hush_accept_failures(asyncio.get_running_loop())  # before the first accept
        await super().startup(sockets)

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:  # on_tick returns True once should_exit is set
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._exit.wait()
            counter = (counter + TICKS_PER_RENEWAL) % COUNTER_WRAP
            should_exit = await self.on_tick(counter)

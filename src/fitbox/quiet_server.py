"""uvicorn's server, woken once a second instead of ten times while nothing happens.

uvicorn's ``main_loop`` sleeps 0.1 s at a time to notice ``should_exit`` and to renew the
``Date`` header once a second. Those ten wake-ups a second are fitbox's own idle work while
an engine computes beside it; on a 2-core box each takes the GIL and a core from llama.cpp,
whose threads then wait for each other at their barriers. Here the loop waits on an event
that ``should_exit`` sets (from a signal handler or another thread alike), and ticks once a
second for the header, as uvicorn's every tenth tick did.
"""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn

TICK_S = 1.0  # uvicorn renews the Date header on every tenth 0.1 s tick: once a second
TICKS_PER_RENEWAL = 10  # uvicorn's on_tick renews the headers when counter % 10 == 0
COUNTER_WRAP = 864_000  # uvicorn's own counter wraps here


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

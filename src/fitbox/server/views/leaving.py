"""The server's word that it is stopping, for responses that never end on their own (the
dashboard's event stream): uvicorn waits for open responses before the app's shutdown
runs, so a stream that waited for that would hold every stop for the grace period."""

from __future__ import annotations

import asyncio


class Leaving:
    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def now(self) -> None:
        """Say it (from any thread, or a signal handler): open streams end."""
        self._loop.call_soon_threadsafe(self.event.set)

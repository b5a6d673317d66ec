"""After a stop, wait until the device really has the memory back before loading into it.

GPU drivers can release a dead process's VRAM late (llama-swap #97; Ollama polls every
250 ms for up to 5 s). A load counted on memory that is not free yet fails with OOM.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.1
LIMIT_S = 5.0


async def await_free(
    read_free: Callable[[], int | None],
    needed: int,
    limit_s: float = LIMIT_S,
    poll_s: float = POLL_S,
) -> tuple[bool, float]:
    """Poll ``read_free`` until it reports at least ``needed`` bytes (True) or the bound
    passes (False); also the seconds waited. None from the reader means "cannot tell": go."""
    started = time.monotonic()
    while True:
        free = read_free()
        if free is None or free >= needed:
            return True, time.monotonic() - started
        if time.monotonic() - started >= limit_s:
            return False, time.monotonic() - started
        await asyncio.sleep(poll_s)

"""What each resident holds now, against its budget: a child whose cache grows with its
tokens (its engine reports ``held_now``) occupies less than its footprint until it has
grown, and the room keeps the difference for it (Resident.in_use, box/snapshot.py).

Read with every sensor reading; an engine that allocates its whole footprint at load
answers None without asking its child anything.
"""

from __future__ import annotations

import asyncio

from fitbox.core.types import ResidentState

from .residents import Registry

ASK_S = 1.0  # a hung child (the watchdog's business) must not stall the sensor readings


async def refresh_held_now(registry: Registry) -> None:
    """Ask each ready resident's engine what its child holds now; one that does not answer
    in ``ASK_S`` keeps the last answer."""
    for resident in list(registry):
        child = resident.child
        if resident.state is not ResidentState.READY or child is None:
            continue
        if resident.basis != "measured":
            continue  # still priced by its estimate: nothing measured to grow from
        try:
            # asyncio.timeout, never wait_for: on 3.11 a wait_for whose inner call is done
            # when a cancel lands returns its result and loses the cancel, and the sensor
            # loop that asked then ran on after a stop cancelled it (the stop hung forever)
            async with asyncio.timeout(ASK_S):
                now = await resident.engine.held_now(child)
        except TimeoutError:
            continue
        if resident.child is child and resident.state is ResidentState.READY:
            resident.held_now = now

"""Slots: how many calls one llama-server child serves at once, and how much of its window
each may fill (FORMULAS.md §Slots).

Measured on this build (SmolLM2, ``-c 4096``): with a unified KV cache (``--kv-unified``)
the KV and compute buffers are the same bytes at 1, 2, 4 and 8 slots; only the logits
grow, one ``n_vocab`` f32 row per slot. So every slot may use the whole window (the
cells are shared), and a slot costs one logits row. Without it, each slot gets
``window / slots`` and the KV bytes are the same anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitbox.core.sizing import kv_cells

MAX_SLOTS = 64  # a bound on a setting, not a measured limit: llama-server takes any -np


@dataclass(frozen=True)
class Slots:
    count: int  # -np
    unified: bool  # --kv-unified: the slots share the window's cells

    def window_each(self, window: int) -> int:
        """The most tokens one call may hold in a child loaded at ``window``."""
        cells, _ = kv_cells(window, self.count, self.unified)
        return cells

    def window_for(self, need: int) -> int:
        """The window a child must load at for one call to hold ``need`` tokens."""
        return max(need, 1) * (1 if self.unified or self.count <= 1 else self.count)


def choose(parallel: int) -> Slots:
    """The slots a placement gives a child: the ``parallel`` setting (at least 1, at most
    ``MAX_SLOTS``), unified whenever there is more than one: unified slots cost no KV or
    compute bytes over one slot, and each can hold a call as long as the window."""
    count = min(max(parallel, 1), MAX_SLOTS)
    return Slots(count, unified=count > 1)

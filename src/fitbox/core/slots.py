"""Slots: how many calls one llama-server child serves at once, how much of its window each
may fill, and how many cells of a shared pool a call may come to hold (FORMULAS.md §Slots,
§KV cells).

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

    def pool(self, window: int) -> int | None:
        """The cells a child loaded at ``window`` shares among its calls (unified slots);
        None when each slot has cells of its own, which its slot count already guards."""
        return self.window_each(window) if self.unified else None

    def window_for(self, need: int) -> int:
        """The window a child must load at for one call to hold ``need`` tokens."""
        return max(need, 1) * (1 if self.unified or self.count <= 1 else self.count)


def choose(parallel: int) -> Slots:
    """The slots a placement gives a child: the ``parallel`` setting (at least 1, at most
    ``MAX_SLOTS``), unified whenever there is more than one: unified slots cost no KV or
    compute bytes over one slot, and each can hold a call as long as the window."""
    count = min(max(parallel, 1), MAX_SLOTS)
    return Slots(count, unified=count > 1)


@dataclass(frozen=True)
class Demand:
    """What one generating call may come to hold of a unified pool of cells (FORMULAS.md
    §KV cells): per choice its prompt, the cell the engine writes next and its reply.
    ``prompt``: the model's own count, or a bound never below it; ``reply``: the budget the
    call asked for (``max_tokens``), or None when it asked for none: llama-server then
    writes until the end of sequence or a full slot, and a unified slot is the whole pool,
    so the call may come to hold all of it."""

    prompt: int
    reply: int | None
    choices: int = 1

    def cells(self, pool: int) -> int:
        """Cells it holds of a pool of ``pool`` cells: never more than the pool, which is
        also the longest a unified slot runs (the engine cuts a longer reply there)."""
        per = self.prompt + 1 + (pool if self.reply is None else max(self.reply, 0))
        return min(max(self.choices, 1) * per, pool)


def admits(pool: int, held: int, need: int) -> bool:
    """Whether a call needing ``need`` cells may start beside calls holding ``held`` of a
    pool of ``pool``: while its need fits what they leave. A call alone always starts (its
    need is capped at the pool): no call waits for nothing, none fails for another."""
    return held == 0 or held + need <= pool

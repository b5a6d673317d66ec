"""Slots (core/slots.py, FORMULAS.md §Slots): unified slots cost a logits row each, and
every one may hold a call as long as the window."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fitbox.core import sizing
from fitbox.core.ask import Ask
from fitbox.core.decide import decide
from fitbox.core.decision import Place
from fitbox.core.slots import MAX_SLOTS, Demand, Slots, admits, choose
from fitbox.core.types import Snapshot
from tests.support.core_builders import GiB, host, smollm2


def test_more_than_one_slot_is_unified_and_bounded() -> None:
    assert choose(1) == Slots(1, unified=False)
    assert choose(4) == Slots(4, unified=True)
    assert choose(0).count == 1 and choose(10_000).count == MAX_SLOTS


@given(window=st.integers(1, 40_000), count=st.integers(2, 16))
def test_a_unified_slot_holds_the_whole_window_a_split_one_its_share(
    window: int, count: int
) -> None:
    assert Slots(count, True).window_each(window) == sizing.pad(window)
    assert Slots(count, False).window_each(window) == sizing.pad(sizing.pad(window) // count)
    assert Slots(count, True).window_for(window) == window
    assert Slots(count, False).window_for(window) == window * count


def test_unified_slots_cost_only_logits_as_measured() -> None:
    """The rule FORMULAS.md §Slots measured on the real engine: KV and compute of 4
    unified slots are those of 1; the logits are 4 rows."""
    shape = smollm2().shape
    assert shape is not None
    one = sizing.footprint(shape, 4096, 1)
    four = sizing.footprint(shape, 4096, 4, unified=True)
    assert (four.kv, four.compute) == (one.kv, one.compute)
    assert four.output == 4 * one.output == 4 * shape.n_vocab * 4


def test_a_placement_gives_the_child_its_slots_and_a_window_for_one_call() -> None:
    """A 3000-token call on 4 unified slots needs a 3072 window, not 4 x 3000."""
    snapshot = Snapshot((host(8 * GiB),), (), cores=tuple(range(4)))
    decision = decide(snapshot, Ask("smollm2", (smollm2(),), need=3000, window=512, parallel=4))
    assert isinstance(decision, Place)
    assert (decision.slots, decision.kv_unified, decision.window) == (4, True, 3072)
    ((_, priced),) = decision.footprint
    shape = smollm2().shape
    assert shape is not None  # priced as unified: the window's cells once, 4 logits rows
    assert priced.kv == sizing.kv_bytes(shape, 3072, 1).total
    assert priced.output == 4 * shape.n_vocab * 4
    split = decide(snapshot, Ask("smollm2", (smollm2(),), need=1500, window=512, parallel=1))
    assert isinstance(split, Place) and (split.slots, split.kv_unified) == (1, False)


# -- cells of a shared pool (FORMULAS.md §KV cells) ------------------------------------------


@given(
    prompt=st.integers(0, 20_000),
    reply=st.none() | st.integers(0, 20_000),
    choices=st.integers(1, 8),
    pool=st.integers(256, 40_000),
)
def test_a_call_holds_its_prompt_and_reply_never_more_than_the_pool(
    prompt: int, reply: int | None, choices: int, pool: int
) -> None:
    cells = Demand(prompt, reply, choices).cells(pool)
    assert 0 < cells <= pool
    if reply is None:  # no max_tokens: it may write until the window is full
        assert cells == pool
    else:
        assert cells == min(choices * (prompt + 1 + reply), pool)
    assert admits(pool, 0, cells)  # alone it always starts: no call waits for nothing


def test_two_long_prompts_that_fit_alone_do_not_start_together() -> None:
    """The issue's case: two 2,331-token prompts at a 4096 window (unified), each with a
    512-token reply budget, or none."""
    pool = Slots(4, True).pool(4096)
    assert pool == 4096 and Slots(1, False).pool(4096) is None
    one = Demand(2331, 512).cells(pool)
    assert one == 2844 and admits(pool, 0, one) and not admits(pool, one, one)
    assert admits(pool, one, Demand(20, 64).cells(pool))  # a short call fits beside it
    whole = Demand(20, None).cells(pool)
    assert whole == pool and not admits(pool, Demand(20, 64).cells(pool), whole)


@given(needs=st.lists(st.integers(1, 5000), min_size=1, max_size=12), pool=st.integers(256, 8192))
def test_admitted_calls_never_hold_more_than_the_pool_unless_alone(
    needs: list[int], pool: int
) -> None:
    held, running = 0, 0
    for need in (min(n, pool) for n in needs):
        if admits(pool, held, need):
            held, running = held + need, running + 1
    assert held <= pool or running == 1

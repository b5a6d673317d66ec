"""Crash-loop rules, with the clock passed in."""

from __future__ import annotations

from fitbox.box.supervision.crashes import CrashLedger


def test_backoff_doubles_and_is_capped() -> None:
    ledger = CrashLedger(limit=10, backoff=1.0, backoff_max=5.0)
    assert ledger.wait_before_restart("m", 0.0) == 0.0
    ledger.crashed("m", "exit 1", [], 100.0)
    assert ledger.wait_before_restart("m", 100.0) == 1.0
    ledger.crashed("m", "exit 1", [], 101.0)
    assert ledger.wait_before_restart("m", 101.5) == 1.5  # 2 s after the second crash
    for t in (103.0, 107.0, 115.0):
        ledger.crashed("m", "exit 1", [], t)
    assert ledger.wait_before_restart("m", 115.0) == 5.0  # capped


def test_too_many_crashes_in_the_window_mark_it_failed_until_cleared() -> None:
    ledger = CrashLedger(limit=3, window=60.0)
    assert ledger.crashed("m", "a", [], 0.0) is None
    assert ledger.crashed("m", "b", [], 100.0) is None  # the first fell out of the window
    assert ledger.crashed("m", "c", [], 110.0) is None
    failed = ledger.crashed("m", "d", ["last line"], 120.0)
    assert failed is not None and failed.reason == "d" and failed.crashes == 3
    assert ledger.failed("m") == failed and ledger.failed("other") is None
    assert ledger.clear("m") and ledger.failed("m") is None
    assert ledger.wait_before_restart("m", 120.0) == 0.0 and not ledger.clear("m")

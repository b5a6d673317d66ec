"""Measured speeds: the medians the core reads, and the bandwidth curve a claim reads."""

from __future__ import annotations

import pytest

from fitbox.box.speeds import median_speeds
from fitbox.core import claims
from fitbox.store.db import MeasuredSpeed


def speed(decode_ms: float) -> MeasuredSpeed:
    return MeasuredSpeed("m", 1, 1, "ram-only", "host", 10, 2.0, 64, decode_ms, None, 0.0)


def test_the_curve_is_the_median_decode_rate_per_core_count_and_a_claim_reads_it() -> None:
    by_cores = [(1, 20.0), (1, 25.0), (1, 20.0), (2, 10.0), (2, 10.1), (2, 9.9)]
    got = median_speeds([speed(ms) for _, ms in by_cores], by_cores)
    assert got.decode_ms == pytest.approx(15.05) and got.prompt_ms == 2.0
    assert got.threads == ((1, 50.0), (2, 100.0))  # tokens/s: 1000 / the median ms
    # two cores double the rate: alone on a two-core box, it keeps both
    assert claims.claim(range(2), (), [], (), weights_in_ram=True, floor=1,
                        threads=got.threads) == claims.Claim((0, 1))  # fmt: skip
    flat = median_speeds([], [(1, 10.0), (2, 10.05)]).threads
    # the second core adds under 1 %: the OS keeps its core
    assert claims.claim(range(2), (), [], (), weights_in_ram=True, floor=1,
                        threads=flat) == claims.Claim((1,))  # fmt: skip

"""Estimates against the engine: for every test model and a grid of windows, slots and
cache types, the real llama-server's allocations (parsed from its load log) against
fitbox's prediction from the file header, per buffer kind (targets from issue #3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.estimate_accuracy import QUICK_GRID, Row, compare, models
from fitbox.core import sizing
from fitbox.models.gguf_facts import read_facts

pytestmark = pytest.mark.engine
MIB = 1 << 20


def within_target(row: Row) -> bool:
    diff = abs(row.predicted - row.measured)
    if row.kind in ("weights", "kv"):  # arithmetic: equal to within the log's rounding
        return diff <= MIB
    if row.kind == "compute":
        return diff <= max(0.10 * row.measured, 32 * MIB)
    if row.kind == "total":
        return diff <= 0.03 * row.measured
    return diff <= MIB  # output


def test_every_estimate_is_within_its_target(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    rows: list[Row] = []
    for name, path in models(tmp_path).items():
        shape = read_facts(path).shape
        for spec in QUICK_GRID:
            if sizing.kv_type_problem(shape, spec.type_k, spec.type_v, flash_attn=True):
                continue
            rows.extend(compare(name, path, spec, llama_server_bin))
    assert len({r.model for r in rows}) == 6 and len(rows) >= 6 * 3 * 5
    misses = [r for r in rows if not within_target(r)]
    assert not misses, "\n".join(
        f"{r.model} {r.spec} {r.kind}: predicted {r.predicted} measured {r.measured}"
        for r in misses
    )

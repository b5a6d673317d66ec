"""Estimates against the engine: for every test model, every quant type the bundled
llama-quantize writes without an importance matrix, and a grid of windows, slots, cache
types and flash attention, the real llama-server's allocations (parsed from its load log)
against fitbox's prediction from the file header, per buffer kind. The targets are issue
#13's: weights and KV within 1 MiB, compute within 2 %, total within 1 %. The models are
small, so weights and KV are also held to the load log's own rounding (0.01 MiB a buffer):
a repacked copy left out would miss by megabytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.estimate_accuracy import QUICK_GRID, Row, compare, jobs, predict
from fitbox.engines.measure import LoadSpec, measure_load
from fitbox.models.gguf_facts import read_facts
from tests.support.quants import quantized_models, repacking_cpu

pytestmark = pytest.mark.engine
MIB = 1 << 20
ROUNDING = 0.02 * MIB  # two buffers printed to 0.01 MiB (mapped + repacked, K + V)


def misses(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        exact = r.kind not in ("weights", "kv") or abs(r.predicted - r.measured) <= ROUNDING
        if not (r.met and exact):
            out.append(
                f"{r.model} {r.spec} {r.kind}: predicted {r.predicted} measured "
                f"{r.measured} ({r.error:+.2%})"
            )
    return out


def test_every_zoo_model_and_quant_type_is_within_its_target(
    tmp_path: Path, quant_cache: Path, llama_server_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FITBOX_TEST_CACHE", str(quant_cache))
    rows: list[Row] = []
    for name, path, spec in jobs(tmp_path, QUICK_GRID, "", rotate=True):
        rows.extend(compare(name, path, spec, llama_server_bin))
    models = {r.model for r in rows}
    assert {"smollm2", "Q4_K_M", "IQ4_XS", "Q2_0", "moe-Q4_0", "tied-Q4_0"} <= models
    assert len(models) == 6 + 28 and {r.spec for r in rows} >= {s.label() for s in QUICK_GRID}
    assert not misses(rows), "\n".join(misses(rows))


def test_the_repack_rule_is_exercised_and_switches_off_with_no_repack(
    quant_cache: Path, llama_server_bin: Path
) -> None:
    cpu = repacking_cpu(llama_server_bin)
    quants = quantized_models(quant_cache / "quants")  # made by the fixture: read back
    for name in ("Q4_0", "Q4_K_M", "moe-MXFP4_MOE"):
        path = quants[name]
        on, off = LoadSpec(1024, 1), LoadSpec(1024, 1, repack=False)
        packed = measure_load(llama_server_bin, path, on).model_buffers
        plain = measure_load(llama_server_bin, path, off).model_buffers
        assert packed.get("CPU_REPACK", 0) > MIB // 8 and "CPU_REPACK" not in plain, name
        shape = read_facts(path).shape
        assert abs(predict(path, on, cpu)["weights"] - sum(packed.values())) <= ROUNDING
        assert abs(predict(path, off, cpu)["weights"] - sum(plain.values())) <= ROUNDING
        assert abs(sum(plain.values()) - shape.weights_bytes) <= ROUNDING  # the file alone

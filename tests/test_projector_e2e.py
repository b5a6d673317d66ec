"""A vision projector (--mmproj) joins the footprint: its weights and its compute buffer,
estimated from its header (core/projector.py) against a real llama-server loading a real
projector file written with gguf. The box launches with it in tests/test_vision_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitbox.core import sizing
from fitbox.core.projector import projector_footprint
from fitbox.engines.llama_server import inspect
from fitbox.engines.measure import LoadSpec, measure_load
from fitbox.models.gguf_facts import read_facts

from .support.ggufs import write_tiny_llama, write_vision_projector

pytestmark = pytest.mark.engine
MIB = 1 << 20


def test_a_projector_adds_its_weights_and_compute_and_the_estimate_follows(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    text = write_tiny_llama(tmp_path / "text.gguf", n_embd=256, n_head=4, n_ff=768, n_ctx=4096)
    mmproj = write_vision_projector(
        tmp_path / "mmproj.gguf",
        n_embd_text=256,
        image_size=224,
        patch_size=14,
        n_embd=256,
        n_ff=1024,
        n_layer=4,
    )
    facts, projector = read_facts(text), read_facts(mmproj).projector
    assert projector is not None and projector.positions == 257
    alone = measure_load(llama_server_bin, text, LoadSpec(1024, 1)).bytes_by_kind()
    both_report = measure_load(llama_server_bin, text, LoadSpec(1024, 1, mmproj=mmproj))
    both = both_report.bytes_by_kind()
    assert "mmproj" in both_report.model_buffers, both_report.errors
    cpu = inspect(llama_server_bin).cpu
    estimate = sizing.footprint(facts.shape, 1024, 1, cpu=cpu, projector=projector)
    assert abs(estimate.weights - both["model"]) <= 0.02 * MIB
    assert abs(estimate.compute - both["compute"]) <= 0.02 * both["compute"]
    measured_total = both["model"] + both["kv"] + both["compute"] + both["output"]
    assert abs(estimate.total - measured_total) <= 0.01 * measured_total
    added = projector_footprint(projector)  # what the projector alone adds, per kind
    assert abs(added.weights - (both["model"] - alone["model"])) <= 0.02 * MIB
    assert abs(added.compute - (both["compute"] - alone["compute"])) <= 0.02 * MIB
    assert both["kv"] == alone["kv"] and added.compute > MIB

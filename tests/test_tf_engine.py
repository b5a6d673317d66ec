"""The transformers engine's fitbox side, without a child: discovery, argv, what /props
means for placement, adapters named by fitbox.json, the requirement list."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fitbox.engines.kinds import on_this_box
from fitbox.engines.seam import EngineNotFound, LaunchIntent
from fitbox.engines.tf import build_argv, candidates, held_from_props, probe, select
from fitbox.installer.tf_engine import requirements
from fitbox.models.transformers_facts import BadModelDir, adapter_bytes, adapter_of

from .support.hf_models import llama_dir


def test_discovery_order_and_a_missing_engine_names_its_fix(tmp_path: Path) -> None:
    (tmp_path / ".venvs" / "a" / "bin").mkdir(parents=True)
    env = {
        "FITBOX_TF_PYTHON": "/nowhere/python",
        "HOME": str(tmp_path),
        "VIRTUAL_ENV": str(tmp_path / "active"),
    }
    found = candidates(tmp_path / "engines", env)
    assert [c.source for c in found][:3] == [
        "FITBOX_TF_PYTHON",
        "engine dir (fitbox install --tf)",
        "VIRTUAL_ENV",
    ]
    assert found[1].python == tmp_path / "engines" / "tf" / "bin" / "python"
    assert found[-1].python == tmp_path / ".venvs" / "a" / "bin" / "python"
    with pytest.raises(EngineNotFound) as raised:
        select(tmp_path / "engines", env)
    message = str(raised.value)
    assert "fitbox install --tf" in message and "/nowhere/python: not there" in message


def test_an_interpreter_is_accepted_only_after_importing_the_engine(tmp_path: Path) -> None:
    found = probe(Path(sys.executable))  # fitbox's own venv: no torch, by design
    assert not found.usable and "cannot import torch" in str(found.problem)


def test_the_transformers_kind_serves_folders_and_the_child_gets_its_placement() -> None:
    kinds = on_this_box()
    assert kinds.for_format("transformers").name == "transformers"
    intent = LaunchIntent(
        model_path=Path("/m/smol"),
        alias="smol",
        window=512,
        parallel=4,
        gpu_layers=0,
        port=9,
        threads=2,
    )
    argv = build_argv(Path("/venv/bin/python"), intent)
    assert argv[:2] == ["/venv/bin/python", "-c"] and Path(argv[3]).name == "engines"
    assert (Path(argv[3]) / "tf_child" / "__main__.py").is_file()
    pairs = dict(zip(argv[4::2], argv[5::2], strict=False))
    assert pairs["--device"] == "cpu" and pairs["--threads"] == "2" and pairs["--window"] == "512"
    tf = kinds.for_format("transformers")
    assert tf.slots(intent.parallel) == 1  # one call at a time, whatever FITBOX_PARALLEL
    assert tf.slots_for(3) == 1  # its n choices are one batch, in one call
    llama = kinds.for_format("gguf")
    assert (llama.slots(4), llama.slots_for(3)) == (4, 3)  # a slot per choice


def test_props_become_held_bytes_with_the_windows_kv_budget() -> None:
    props = {
        "weights": {"total": 1000, "by_device": {"cpu": 1000}},
        "n_ctx": 512,
        "rss_bytes_after_load": 1500,
        "kv_bytes_now": 0,
    }
    held = held_from_props(props, kv_budget=300)
    assert held is not None
    assert (held.weights, held.kv, held.compute, held.n_ctx) == (1000, 300, 500, 512)
    assert held_from_props({"weights": "?"}, 1) is None


def test_an_adapter_named_by_fitbox_json_must_be_there(tmp_path: Path) -> None:
    folder = llama_dir(tmp_path / "base")
    assert adapter_of(folder) is None and adapter_bytes(folder) == 0
    (folder / "fitbox.json").write_text(json.dumps({"adapter_dir": "lora"}))
    with pytest.raises(BadModelDir, match=r"no adapter_config\.json"):
        adapter_of(folder)
    (folder / "lora").mkdir()
    (folder / "lora" / "adapter_config.json").write_text("{}")
    assert adapter_of(folder) == (folder / "lora").resolve()


def test_the_engine_venv_comes_from_the_tf_engine_extra() -> None:
    reqs = requirements()
    assert "torch==2.13.0" in reqs  # the CPU build here; a plain torch pulls CUDA's
    assert {r.split(">")[0].split("=")[0] for r in reqs} >= {
        "transformers",
        "accelerate",
        "peft",
        "sentence-transformers",
        "safetensors",
    }

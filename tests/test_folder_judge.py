"""The scan's judgement of a transformers folder from its files (models/folder_judge.py),
the engine's probe that says what its transformers loads and whether bitsandbytes imports,
and fitbox's edge refusing an engine body that holds a bare NaN."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from fitbox.engines.tf import probe, write_support
from fitbox.errors import ModelNotServable
from fitbox.models.catalog import Catalog, scan
from fitbox.models.folder_judge import EngineSupport, read_support
from fitbox.server.inference.engine_errors import non_finite

from .support.hf_models import LLAMA, llama_dir, write_config

SUPPORT = EngineSupport("5.0", frozenset({"LlamaForCausalLM", "BertModel"}), frozenset({"llama"}))


def reasons(root: Path, support: EngineSupport | None = SUPPORT) -> dict[str | None, str]:
    served, rejected = scan([root], None, support)
    assert all(a.name not in {r.name for r in rejected} for a in served)
    return {r.name: r.reason for r in rejected}


def test_a_folder_fit_to_serve_is_served(tmp_path: Path) -> None:
    llama_dir(tmp_path / "good")
    served, rejected = scan([tmp_path], None, SUPPORT)
    assert [a.name for a in served] == ["good"] and rejected == []


def test_no_tokenizer_is_refused_with_what_to_copy(tmp_path: Path) -> None:
    (llama_dir(tmp_path / "bare") / "tokenizer.json").unlink()
    assert "it has no tokenizer" in reasons(tmp_path)["bare"]
    (tmp_path / "bare" / "tokenizer.model").write_bytes(b"\x0a")  # sentencepiece counts
    assert reasons(tmp_path) == {}


def test_an_architecture_the_engine_lacks_is_refused_only_once_the_engine_said(
    tmp_path: Path,
) -> None:
    folder = llama_dir(tmp_path / "frob")
    write_config(folder, {**LLAMA, "architectures": ["FrobForCausalLM"], "model_type": "frob"})
    assert "FrobForCausalLM is unknown to transformers 5.0" in reasons(tmp_path)["frob"]
    assert reasons(tmp_path, None) == {}  # no probe has said what it loads: not judged


def test_remote_code_is_refused_unless_transformers_ships_the_model_type(tmp_path: Path) -> None:
    folder = llama_dir(tmp_path / "custom")
    auto_map = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    write_config(folder, {**LLAMA, "model_type": "x", "auto_map": auto_map})
    assert "needs its own Python code" in reasons(tmp_path)["custom"]
    assert "needs its own Python code" in reasons(tmp_path, None)["custom"]
    # an old config that kept its auto_map for a type transformers has since shipped
    write_config(folder, {**LLAMA, "auto_map": auto_map})
    assert reasons(tmp_path) == {}
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": []}}))
    write_config(folder, {**LLAMA, "model_type": "x"})
    assert "tokenizer_config.json has an auto_map" in reasons(tmp_path)["custom"]


def test_nan_at_the_start_of_a_tensor_is_found_by_the_sample(tmp_path: Path) -> None:
    folder = llama_dir(tmp_path / "nan")
    weights = folder / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    begin = 8 + n + header["model.layers.0.input_layernorm.weight"]["data_offsets"][0]
    raw[begin : begin + 4] = struct.pack("<f", float("inf"))
    weights.write_bytes(bytes(raw))
    found = reasons(tmp_path)["nan"]
    assert "'model.layers.0.input_layernorm.weight'" in found and "NaN or infinity" in found


def test_a_truncated_folder_is_named_so_a_call_gets_its_reason(tmp_path: Path) -> None:
    folder = llama_dir(tmp_path / "cut")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    catalog = Catalog((tmp_path,), tmp_path / "aliases.toml")
    with pytest.raises(ModelNotServable) as refused:  # not "does not exist": its reason
        catalog.resolve("cut")
    error = refused.value.body()["error"]
    assert (
        error["code"] == "model_not_servable" and "truncated download" in (error["operator_reason"])
    )


def test_the_catalog_judges_again_when_the_engine_s_support_changes(tmp_path: Path) -> None:
    root = tmp_path / "models"
    folder = llama_dir(root / "frob")
    write_config(folder, {**LLAMA, "architectures": ["FrobForCausalLM"], "model_type": "frob"})
    support = tmp_path / "tf-capabilities.json"
    catalog = Catalog((root,), tmp_path / "aliases.toml", None, support)
    assert [a.name for a in catalog.artifacts()] == ["frob"]  # nothing said yet
    said = {"transformers": "5.0", "architectures": ["LlamaForCausalLM"], "model_types": []}
    support.write_text(json.dumps(said))
    catalog.rejudge()
    assert catalog.artifacts() == [] and catalog.rejected[0].name == "frob"
    assert read_support(support) == EngineSupport(
        "5.0", frozenset({"LlamaForCausalLM"}), frozenset()
    )


def test_the_probe_says_why_bitsandbytes_cannot_give_the_four_bit_rung(tmp_path: Path) -> None:
    """A stand-in interpreter (a real executable) that answers the probe as one whose
    bitsandbytes is installed but fails to import: no 4bit rung, and the reason."""
    said = {
        "modules": {"torch": "2.13", "transformers": "5.0", "safetensors": "0.8"},
        "failed": {"bitsandbytes": "OSError: libbitsandbytes_cpu.so: cannot open"},
        "four_bit": False,
        "cuda": False,
        "support": {"transformers": "5.0", "architectures": ["LlamaForCausalLM"],
                    "model_types": ["llama"]},
    }  # fmt: skip
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho '{json.dumps(said)}'\n")
    python.chmod(0o755)
    found = probe(python)
    assert found.usable and not found.four_bit
    assert "bitsandbytes failed to import" in str(found.four_bit_problem())
    assert "libbitsandbytes_cpu.so" in str(found.four_bit_problem())
    write_support(tmp_path / "support.json", found)
    assert read_support(tmp_path / "support.json") == EngineSupport(
        "5.0", frozenset({"LlamaForCausalLM"}), frozenset({"llama"})
    )
    absent = {**said, "failed": {}}
    python.write_text(f"#!/bin/sh\necho '{json.dumps(absent)}'\n")
    assert "not in the engine environment" in str(probe(python).four_bit_problem())


def test_an_engine_body_with_a_bare_nan_is_found_and_a_quoted_one_is_not() -> None:
    assert non_finite(b'{"data":[{"embedding":[0.1,NaN]}]}')
    assert non_finite(b'{"x":-Infinity}')
    assert not non_finite(b'{"message":"NaN or Infinity in a string"}')
    assert not non_finite(b'{"data":[0.5]}')

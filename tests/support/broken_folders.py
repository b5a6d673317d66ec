"""Transformers folders that look like models and cannot be served, each broken one way,
made from a tiny real llama folder (random weights, SmolLM2's tokenizer and chat template;
built once per cache in the engine venv) by symlinks, an edited config.json or patched
bytes: no tokenizer, NaN weights where the scan samples them and where it does not, a
truncated safetensors file, an architecture transformers lacks, code of its own."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from fitbox.models.safetensors_header import read_safetensors_header

from .paths import CACHE
from .tf_engine import _made_once

MAKE_TINY = r"""
import sys
from pathlib import Path
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
smol, out = Path(sys.argv[1]), Path(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(smol)
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id,
                     eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
torch.manual_seed(0)
LlamaForCausalLM(config).eval().save_pretrained(out)
tokenizer.save_pretrained(out)
"""
NAN_F32 = struct.pack("<I", 0x7FC00000)
DEEP_TENSOR = "model.layers.0.mlp.down_proj.weight"  # NaN in its middle: every logit NaN


def tiny_tf_folder(python: Path, smol: Path) -> Path:
    """The tiny llama folder (float32, 2 layers of width 64), built once per cache."""
    return _made_once(python, MAKE_TINY, smol, CACHE / "tf-models" / "tiny-llama-tf")


def _linked(tiny: Path, out: Path, *, leave: tuple[str, ...] = ()) -> Path:
    """``out`` with a symlink to each of ``tiny``'s files but those in ``leave``."""
    out.mkdir(parents=True)
    for item in tiny.iterdir():
        if item.name not in leave:
            (out / item.name).symlink_to(item)
    return out


def _copied_weights(tiny: Path, out: Path) -> Path:
    """``out`` linked to ``tiny`` but for a copy of its weights, which the caller patches."""
    _linked(tiny, out, leave=("model.safetensors",))
    shutil.copyfile(tiny / "model.safetensors", out / "model.safetensors")
    return out / "model.safetensors"


def _nan_at(weights: Path, tensor: str | None, middle: bool) -> None:
    """One float32 NaN written into ``tensor`` (the first by offset when None): at its
    first element, or in its middle (past what the scan samples)."""
    header = read_safetensors_header(weights)
    start = weights.stat().st_size - header.data_bytes
    name = tensor or min(header.tensors, key=lambda n: header.tensors[n].data_offsets)
    found = header.tensors[name]
    assert found.dtype == "F32", found
    offset = start + found.data_offsets[0] + (found.nbytes // 2 // 4 * 4 if middle else 0)
    with weights.open("r+b") as f:
        f.seek(offset)
        f.write(NAN_F32)


def no_tokenizer(tiny: Path, out: Path) -> Path:
    keep = {"config.json", "model.safetensors", "generation_config.json"}
    return _linked(tiny, out, leave=tuple(p.name for p in tiny.iterdir() if p.name not in keep))


def nan_sampled(tiny: Path, out: Path) -> Path:
    _nan_at(_copied_weights(tiny, out), None, middle=False)
    return out


def nan_deep(tiny: Path, out: Path) -> Path:
    _nan_at(_copied_weights(tiny, out), DEEP_TENSOR, middle=True)
    return out


def truncated(tiny: Path, out: Path) -> Path:
    weights = _copied_weights(tiny, out)
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size - 4096)
    return out


def _with_config(tiny: Path, out: Path, **changes: object) -> Path:
    _linked(tiny, out, leave=("config.json",))
    config = json.loads((tiny / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **changes}))
    return out


def unknown_architecture(tiny: Path, out: Path) -> Path:
    return _with_config(
        tiny, out, architectures=["FrobnicatorForCausalLM"], model_type="frobnicator"
    )


def remote_code(tiny: Path, out: Path) -> Path:
    return _with_config(
        tiny,
        out,
        architectures=["FrobForCausalLM"],
        model_type="frob",
        auto_map={
            "AutoConfig": "configuration_frob.FrobConfig",
            "AutoModelForCausalLM": "modeling_frob.FrobForCausalLM",
        },
    )

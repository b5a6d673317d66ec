"""Hugging Face model folders written by hand: real safetensors files (data included) and
config.json, and a small Llama-shaped folder the tests price."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

from fitbox.models.transformers_facts import DTYPE_BITS

NP = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def write_safetensors(
    path: Path, tensors: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None
) -> int:
    """Write a real safetensors file (data included); returns the tensor bytes."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata is not None else {}
    data = b""
    for name, (dtype, shape) in tensors.items():
        n = math.prod(shape)
        if dtype in NP:
            blob = (np.arange(n) % 100).astype(NP[dtype]).reshape(shape).tobytes()
        else:
            blob = bytes(DTYPE_BITS[dtype] * n // 8)
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(data), len(data) + len(blob)],
        }
        data += blob
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return len(data)


def write_raw(path: Path, header: object, data_len: int, *, raw: bytes | None = None) -> Path:
    """Write a file whose header says whatever the test wants it to."""
    body = raw if raw is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + bytes(data_len))
    return path


def write_config(directory: Path, config: dict[str, Any], name: str = "config.json") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(config))


LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "vocab_size": 1000,
}
LLAMA_TENSORS = {
    "model.embed_tokens.weight": ("F16", [1000, 512]),
    "model.layers.0.self_attn.k_proj.weight": ("F16", [128, 512]),
    "model.layers.0.input_layernorm.weight": ("F32", [512]),
    "lm_head.weight": ("BF16", [1000, 512]),
}
LLAMA_BYTES = 1000 * 512 * 2 + 128 * 512 * 2 + 512 * 4 + 1000 * 512 * 2


def write_tokenizer(directory: Path) -> None:
    """A tokenizer file, as a folder fit to serve has one (the scan looks for its name)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')


def llama_dir(tmp_path: Path) -> Path:
    write_config(tmp_path, LLAMA)
    write_safetensors(tmp_path / "model.safetensors", LLAMA_TENSORS, {"format": "pt"})
    write_tokenizer(tmp_path)
    return tmp_path

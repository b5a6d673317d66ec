"""Where a Hugging Face model's weights sit, tensor by tensor, from its safetensors headers.

Two things placement needs beyond the total (transformers_facts.py): the per-layer
``Layout`` (which bytes are routed experts, which are the embeddings and the output), so a
mixture of experts can keep its experts in RAM; and the bytes of the same weights
quantized to 4-bit at load by bitsandbytes (FORMULAS.md §4-bit in place). Names, not
guesses: a tensor is a layer's when its name has ``layers.N.`` (or ``h.N.``, ``blocks.N.``),
an expert's when it sits under ``.experts.`` in such a layer (Mixtral's
``block_sparse_moe.experts.E.w1``, Qwen-MoE's ``mlp.experts.E.gate_proj``, gpt-oss's fused
``mlp.experts.gate_up_proj``); a shared expert (``shared_expert``, ``shared_experts``) is the
layer's own, as it is for llama.cpp's ``--cpu-moe``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fitbox.core.split import Layout
from fitbox.models.safetensors_header import (
    BadSafetensors,
    SafetensorsTensor,
    read_safetensors_header,
)
from fitbox.models.transformers_facts import BadModelDir

LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")
EXPERT = re.compile(r"\.experts\.")
INPUT = re.compile(r"(?:embed_tokens|wte|wpe|word_embeddings|embed_positions)\.")
OUTPUT = re.compile(r"(?:^|\.)lm_head\.")
# bitsandbytes 4-bit (transformers' Bnb4BitHfQuantizer with its defaults): every nn.Linear
# but the output head is packed two values per byte, with one f32 absmax per block of 64
# (bnb.functional.quantize_4bit, blocksize=64, no double quantization).
FOUR_BIT_BLOCK = 64
ABSMAX_BYTES = 4


@dataclass(frozen=True)
class TensorBytes:
    """Every tensor of a folder's weight files: name -> (dtype, shape, bytes)."""

    tensors: dict[str, SafetensorsTensor]

    @classmethod
    def read(cls, files: Iterable[Path]) -> TensorBytes:
        tensors: dict[str, SafetensorsTensor] = {}
        for f in files:
            try:
                tensors.update(read_safetensors_header(f).tensors)
            except BadSafetensors as e:
                raise BadModelDir(f"bad safetensors file {f}: {e.reason}") from e
        return cls(tensors)


def _layer(name: str) -> int | None:
    found = LAYER.search(name)
    return int(found.group(1)) if found else None


def layout(tensors: TensorBytes, n_layer: int) -> Layout:
    """Per-layer bytes, routed experts apart; the embeddings are the input, the head (and
    every tensor outside a layer that is not an embedding, the final norm) the output."""
    layer_bytes, routed = [0] * n_layer, [0] * n_layer
    input_bytes = output_bytes = 0
    tied = True
    for name, t in tensors.tensors.items():
        il = _layer(name)
        if il is not None and il < n_layer:
            if EXPERT.search(name):
                routed[il] += t.nbytes
            else:
                layer_bytes[il] += t.nbytes
        elif INPUT.search(name):
            input_bytes += t.nbytes
        else:
            tied = tied and not OUTPUT.search(name)
            output_bytes += t.nbytes
    return Layout(tuple(layer_bytes), tuple(routed), input_bytes, output_bytes, tied)


def is_four_bit_linear(name: str, t: SafetensorsTensor) -> bool:
    """What bitsandbytes quantizes: a 2-D linear weight of a layer (never the embeddings,
    the norms, the biases or the head, which transformers keeps out of the conversion)."""
    return (
        len(t.shape) == 2
        and name.endswith(".weight")
        and _layer(name) is not None
        and not INPUT.search(name)
    )


def four_bit_bytes(tensors: TensorBytes) -> int:
    """The weights once bitsandbytes loaded them in 4-bit: each linear weight's elements at
    half a byte plus an f32 absmax per block of 64; every other tensor as the file has it
    (FORMULAS.md §4-bit in place)."""
    total = 0
    for name, t in tensors.tensors.items():
        if is_four_bit_linear(name, t):
            elements = t.shape[0] * t.shape[1]
            blocks = -(-elements // FOUR_BIT_BLOCK)
            total += -(-elements // 2) + blocks * ABSMAX_BYTES
        else:
            total += t.nbytes
    return total

"""Bytes per device for a placement across GPUs and host RAM. Pure maths.

Mirrors llama.cpp's layer assignment (llama-model.cpp ``load_tensors``): the input layer
(token embeddings) always stays on the CPU; with ``-ngl N`` the last N of the n_layer + 1
"layers" (the repeating ones, then the output layer) go to the GPUs, split by the
cumulative ``-ts`` proportions; everything else is on the CPU. KV and recurrent state
follow their layer (``--kv-offload``, the default). ``--cpu-moe`` keeps routed experts in
host RAM. FORMULAS.md §Split has each rule with its source.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass

from fitbox.core import sizing
from fitbox.core.repack import (
    MUL_MAT_ID,
    CpuFeatures,
    HostWeights,
    WeightTensor,
    host_weights,
)
from fitbox.core.types import Footprint

HOST = "host"


@dataclass(frozen=True)
class Layout:
    """Where a model's weights sit, layer by layer (models/ reads it from the header)."""

    layer_bytes: tuple[int, ...]  # everything of blk.N except routed experts
    routed_bytes: tuple[int, ...]  # blk.N routed experts (ffn_*_exps)
    input_bytes: int  # token embeddings: always on the CPU
    output_bytes: int  # output norm + output matrix
    output_tied: bool  # no output.weight: the engine duplicates token_embd onto its device


@dataclass(frozen=True)
class Placement:
    gpus: tuple[str, ...] = ()  # device ids, in the engine's (CUDA) order
    gpu_layers: int = 0  # -ngl; n_layer + 1 puts every repeating layer and the output on GPU
    tensor_split: tuple[float, ...] = ()  # -ts proportions; empty means equal shares
    experts_in_ram: bool = False  # --cpu-moe


def _split_points(n_layer: int, placement: Placement) -> tuple[int, int, list[float]]:
    """(the first layer on a GPU, how many slots the GPUs take, the cumulative shares)."""
    shares = list(placement.tensor_split) or [1.0] * len(placement.gpus)
    if len(shares) != len(placement.gpus) or sum(shares) <= 0:
        raise ValueError("tensor split needs one positive share per GPU")
    total, cumulative = sum(shares), []
    running = 0.0
    for share in shares:
        running += share
        cumulative.append(running / total)
    start = max(n_layer + 1 - placement.gpu_layers, 0)
    active = min(placement.gpu_layers, n_layer + 1)  # start + active = n_layer + 1
    return start, active, cumulative


def _gpu_index(n_layer: int, placement: Placement) -> tuple[int, Callable[[int], int]]:
    """(the first layer on a GPU, the index in ``gpus`` of layer il from there on)."""
    start, active, cumulative = _split_points(n_layer, placement)
    last = len(placement.gpus) - 1

    def index(il: int) -> int:
        at = bisect.bisect_right(cumulative, (il - start) / active)  # std::upper_bound
        return min(at, last)

    return start, index


def layer_devices(n_layer: int, placement: Placement) -> tuple[tuple[str, ...], str]:
    """(device of each repeating layer, device of the output layer)."""
    gpus = placement.gpus
    if not gpus or placement.gpu_layers <= 0:
        return (HOST,) * n_layer, HOST
    start, index = _gpu_index(n_layer, placement)

    def device(il: int) -> str:
        return HOST if il < start else gpus[index(il)]

    return tuple(device(il) for il in range(n_layer)), device(n_layer)


def layer_ranges(
    n_layer: int, placement: Placement
) -> tuple[tuple[tuple[str, int, int], ...], str]:
    """``layer_devices`` as (device, first layer, past its last) per device that takes
    repeating layers, and the output layer's device. A device's layers are contiguous (the
    split points only grow): GPU j starts at the first slot s with ``cumulative[j - 1] <=
    s / active``, which is ``ceil(cumulative[j - 1] x active)`` give or take the rounding
    of the same division ``layer_devices`` makes, so O(devices), not O(layers)."""
    gpus = placement.gpus
    if not gpus or placement.gpu_layers <= 0:
        return ((HOST, 0, n_layer),) if n_layer else (), HOST
    start, active, cumulative = _split_points(n_layer, placement)
    firsts = [0]
    for point in cumulative[:-1]:
        slot = min(max(math.ceil(point * active), firsts[-1]), active)
        while slot > firsts[-1] and point <= (slot - 1) / active:
            slot -= 1
        while slot < active and (slot / active) < point:
            slot += 1
        firsts.append(slot)
    firsts.append(active)
    ranges = [(HOST, 0, start)] if start else []
    for gpu, first, past in zip(gpus, firsts, firsts[1:], strict=False):
        low, high = start + first, min(start + past, n_layer)
        if high > low:
            ranges.append((gpu, low, high))
    output = next(g for g, past in zip(gpus, firsts[1:], strict=True) if past > active - 1)
    return tuple(ranges), output


def repack_extra(shape: sizing.ModelShape, placement: Placement, cpu: CpuFeatures | None) -> int:
    """What the repack rule adds to the host's weights for this placement (core/repack.py)."""
    found = in_ram(shape, placement, cpu)
    return found.extra if found else 0


def in_ram(
    shape: sizing.ModelShape, placement: Placement, cpu: CpuFeatures | None
) -> HostWeights | None:
    """The host's model buffers under the repack rule: the tensors in RAM are the input
    layer, the layers (and output layer) left on the host, and routed experts with
    --cpu-moe. None when nothing can repack (no features, a GPU host buffer, no tensors)."""
    if cpu is None or not cpu.repacks or not shape.tensors:
        return None
    layers, output_device = layer_devices(shape.n_layer, placement)

    def stays(t: WeightTensor) -> bool:
        if t.layer < 0 or (placement.experts_in_ram and t.op == MUL_MAT_ID):
            return True
        device = output_device if t.layer >= len(layers) else layers[t.layer]
        return device == HOST

    return host_weights(shape.tensors, cpu, stays)


def footprint_by_device(
    shape: sizing.ModelShape,
    layout: Layout,
    placement: Placement,
    window: int,
    parallel: int,
    *,
    type_k: str = "f16",
    type_v: str = "f16",
    unified: bool = False,
    cpu: CpuFeatures | None = None,
) -> dict[str, Footprint]:
    """Weights, KV (with recurrent state), compute and output bytes on every device used;
    ``cpu``: the engine's CPU features, for what it repacks in RAM."""
    window = sizing.effective_window(shape, window)
    layers, output_device = layer_devices(shape.n_layer, placement)
    cells, streams = sizing.kv_cells(window, parallel, unified)
    swa = sizing.swa_cells(shape, cells, parallel, unified)
    weights: dict[str, int] = {HOST: layout.input_bytes}
    kv_by: dict[str, int] = {}
    for il, device in enumerate(layers):
        weights[device] = weights.get(device, 0) + layout.layer_bytes[il]
        experts_at = HOST if placement.experts_in_ram else device
        weights[experts_at] = weights.get(experts_at, 0) + layout.routed_bytes[il]
        if shape.is_recurrent(il):
            state = sizing.recurrent_layer_bytes(shape, parallel)
        else:
            state = sum(sizing.layer_kv_bytes(shape, il, cells, swa, streams, type_k, type_v))
        kv_by[device] = kv_by.get(device, 0) + state
    weights[output_device] = weights.get(output_device, 0) + layout.output_bytes
    if layout.output_tied and output_device != HOST:
        weights[output_device] += layout.input_bytes  # TENSOR_DUPLICATED onto the device
    weights[HOST] += repack_extra(shape, placement, cpu)
    compute = sizing.compute_bytes(shape, window, parallel, unified)
    devices = set(weights) | set(kv_by)
    return {
        device: Footprint(
            weights=weights.get(device, 0),
            kv=kv_by.get(device, 0),
            # every device that runs layers reserves a graph; the host keeps the logits
            compute=compute if device in layers or device == output_device else 0,
            output=sizing.output_bytes(shape, parallel) if device == HOST else 0,
        )
        for device in sorted(devices)
    }

"""What a loaded model really holds: its tensors counted once each, by device and dtype.

Parameters and buffers are both counted (a rotary table, a position-id buffer are memory
too); a tensor tied to another (the output head sharing the embedding) shares its storage
and is counted once, by storage, which is what the allocator holds.
"""

from __future__ import annotations

import os
from typing import Any


def counted_weights(model: Any) -> dict[str, Any]:
    """``{"total": B, "by_device": {"cpu": B, "cuda:0": B}, "by_dtype": {"float32": B}}``."""
    seen: set[tuple[str, int]] = set()
    by_device: dict[str, int] = {}
    by_dtype: dict[str, int] = {}
    tensors = [t for _, t in model.named_parameters(remove_duplicate=False)]
    tensors += [t for _, t in model.named_buffers(remove_duplicate=False)]
    tensors += [q for t in list(tensors) for q in _quant_state(t)]
    for tensor in tensors:
        if tensor is None or tensor.device.type == "meta":
            continue
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key in seen:  # tied weights, or a view of a tensor already counted
            continue
        seen.add(key)
        nbytes = storage.nbytes()
        device = str(tensor.device)
        dtype = str(tensor.dtype).removeprefix("torch.")
        by_device[device] = by_device.get(device, 0) + nbytes
        by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    return {"total": sum(by_device.values()), "by_device": by_device, "by_dtype": by_dtype}


def _quant_state(tensor: Any) -> list[Any]:
    """The scales bitsandbytes keeps beside a 4-bit weight (its ``quant_state``: an absmax
    per block, and with double quantization the absmax's own scales): memory the
    parameter list does not show."""
    state = getattr(tensor, "quant_state", None)
    found = []
    while state is not None:
        found += [
            t
            for t in (getattr(state, "absmax", None), getattr(state, "code", None))
            if t is not None and hasattr(t, "untyped_storage")
        ]
        state = getattr(state, "state2", None)
    return found


def cache_bytes(cache: Any) -> int:
    """Bytes of the K and V tensors a generation's cache holds now (transformers' cache
    layers each keep ``keys`` and ``values``; an older cache keeps tuples of tensors)."""
    if cache is None:
        return 0
    total = 0
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            for name in ("keys", "values"):
                tensor = getattr(layer, name, None)
                if tensor is not None and hasattr(tensor, "numel"):
                    total += tensor.numel() * tensor.element_size()
        return total
    for pair in cache:
        for tensor in pair:
            total += tensor.numel() * tensor.element_size()
    return total


def resident_bytes() -> int:
    """This process's resident set (the weights, torch's own libraries and allocator)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0

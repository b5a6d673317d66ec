"""Per-device footprints of one candidate, fast to ask again and again.

The core asks the same question for many windows and layer counts; ``split.footprint_by_device``
walks every layer each time. A ``Sizer`` walks them once per placement, groups layers that
cost the same per cell, and answers each window in O(devices x groups). The two agree to
the byte (tests/test_core_parts.py checks it on the model zoo).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import accumulate

from fitbox.core import sizing, split
from fitbox.core.ask import Candidate
from fitbox.core.projector import projector_footprint
from fitbox.core.split import HOST, Placement
from fitbox.core.types import Footprint

# per layer: ("kv", is_swa, heads, k_dim, v_dim) or ("state",) for a recurrent layer
Signature = tuple[object, ...]


@dataclass(frozen=True)
class SplitCosts:
    """Bytes of a split with every layer and the output on GPUs (FORMULAS.md §Split)."""

    layers: list[int]  # each repeating layer on its GPU: weights, its experts unless in RAM, KV
    output: int  # the output layer on the last GPU (with the token embeddings when tied)
    compute: int  # on every GPU that takes a layer or the output
    host: int  # the token embeddings, experts kept in RAM, the logits


class Sizer:
    def __init__(
        self, candidate: Candidate, parallel: int, type_k: str, type_v: str, unified: bool = False
    ) -> None:
        self.candidate = candidate
        self.parallel, self.unified = parallel, unified
        self.type_k, self.type_v = type_k, type_v
        self.cpu = None if candidate.no_repack else candidate.cpu  # what repacks in RAM
        self._placements: dict[
            Placement, tuple[dict[str, int], dict[str, Counter[Signature]], frozenset[str]]
        ] = {}
        self._signatures: tuple[Signature, ...] = ()
        shape = candidate.shape
        if shape is not None:
            sigs: list[Signature] = []
            for il in range(shape.n_layer):
                heads = shape.kv_heads[il] if il < len(shape.kv_heads) else 0
                if shape.is_recurrent(il):
                    sigs.append(("state",))
                elif not shape.has_kv_cache or heads == 0:
                    sigs.append(("none",))
                else:
                    k_dim, v_dim = shape.head_dims(il)
                    sigs.append(("kv", shape.is_swa(il), heads, k_dim, v_dim))
            self._signatures = tuple(sigs)
            self._first_layer: dict[Signature, int] = {}
            for il, sig in enumerate(sigs):
                self._first_layer.setdefault(sig, il)
            attends = [s for s in sigs if s[0] == "kv"]
            self._full = any(not s[1] for s in attends)
            # running sums over the layers: a contiguous range of them costs two lookups
            self._count_before = {
                sig: [0, *accumulate(int(s == sig) for s in sigs)] for sig in self._first_layer
            }
            layout = candidate.layout
            self._layer_before = [0, *accumulate(layout.layer_bytes)] if layout else [0]
            self._routed_before = [0, *accumulate(layout.routed_bytes)] if layout else [0]
            self._attends = bool(attends)
            self._has_swa = shape.n_swa > 0 and any(shape.is_swa(il) for il in range(shape.n_layer))

    @property
    def n_layer(self) -> int:
        return self.candidate.shape.n_layer if self.candidate.shape else 0

    def window(self, window: int) -> int:
        shape = self.candidate.shape
        return sizing.effective_window(shape, window) if shape else window

    def whole(self, window: int, in_ram: bool = True) -> Footprint:
        """Everything on one device (the first cut's model, and any device without layout);
        the repack rule applies only when that device is host RAM."""
        if self.candidate.fixed is not None:
            return self.candidate.fixed
        assert self.candidate.shape is not None
        return sizing.footprint(
            self.candidate.shape,
            window,
            self.parallel,
            type_k=self.type_k,
            type_v=self.type_v,
            unified=self.unified,
            cpu=self.cpu if in_ram else None,
            projector=self.candidate.projector,
        )

    def on(self, placement: Placement, window: int) -> dict[str, Footprint]:
        """Bytes per device for ``placement`` at ``window`` (FORMULAS.md §Split)."""
        candidate = self.candidate
        if candidate.layout is None or candidate.shape is None:
            on_gpu = bool(placement.gpus and placement.gpu_layers)
            return {placement.gpus[0] if on_gpu else HOST: self.whole(window, not on_gpu)}
        shape = candidate.shape
        weights, groups, computes = self._grouped(placement)
        per_sig, compute = self._per_window(window)
        output = sizing.output_bytes(shape, self.parallel)
        out: dict[str, Footprint] = {}
        for device in sorted(set(weights) | set(groups)):
            kv = sum(per_sig[sig] * n for sig, n in groups.get(device, Counter()).items())
            out[device] = Footprint(
                weights=weights.get(device, 0),
                kv=kv,
                compute=compute if device in computes else 0,
                output=output if device == HOST else 0,
            )
        return self._with_projector(out, placement)

    def _with_projector(
        self, out: dict[str, Footprint], placement: Placement
    ) -> dict[str, Footprint]:
        """A projector's bytes on the first GPU of a placement with layers there (the first
        device the child sees), else in RAM (launched with --no-mmproj-offload)."""
        projector = self.candidate.projector
        if projector is None:
            return out
        device = placement.gpus[0] if placement.gpus and placement.gpu_layers else HOST
        extra, has = projector_footprint(projector), out.get(device, Footprint(0, 0, 0, 0))
        out[device] = Footprint(
            has.weights + extra.weights, has.kv, has.compute + extra.compute, has.output
        )
        return out

    def _per_window(self, window: int) -> tuple[dict[Signature, int], int]:
        """(KV or state bytes of one layer of each kind, one device's compute buffer)."""
        shape = self.candidate.shape
        assert shape is not None
        window = sizing.effective_window(shape, window)
        cells, streams = sizing.kv_cells(window, self.parallel, self.unified)
        swa = (
            sizing.swa_window(shape.n_swa, cells, self.parallel, self.unified)
            if self._has_swa
            else 0
        )
        per_sig: dict[Signature, int] = {}
        for sig, il in self._first_layer.items():  # one layer stands for all of its kind
            if sig[0] == "state":
                per_sig[sig] = sizing.recurrent_layer_bytes(shape, self.parallel)
            else:
                per_sig[sig] = sum(
                    sizing.layer_kv_bytes(shape, il, cells, swa, streams, self.type_k, self.type_v)
                )
        mask = ((cells if self._full else 0) + swa) if self._attends else 0
        return per_sig, sizing.compute_for_mask(shape, window, mask)

    def layer_costs(self, window: int, experts_in_ram: bool) -> SplitCosts:
        """The terms of a split that keeps every layer and the output on GPUs, at
        ``window``, as ``on`` adds them up."""
        layout, shape = self.candidate.layout, self.candidate.shape
        assert layout is not None and shape is not None
        per_sig, compute = self._per_window(window)
        layers = [
            layout.layer_bytes[il]
            + (0 if experts_in_ram else layout.routed_bytes[il])
            + per_sig[sig]
            for il, sig in enumerate(self._signatures)
        ]
        output = layout.output_bytes + (layout.input_bytes if layout.output_tied else 0)
        host = layout.input_bytes + (sum(layout.routed_bytes) if experts_in_ram else 0)
        return SplitCosts(layers, output, compute, host + sizing.output_bytes(shape, self.parallel))

    def _grouped(
        self, placement: Placement
    ) -> tuple[dict[str, int], dict[str, Counter[Signature]], frozenset[str]]:
        cached = self._placements.get(placement)
        if cached is not None:
            return cached
        layout = self.candidate.layout
        assert layout is not None
        ranges, output_device = split.layer_ranges(self.n_layer, placement)
        weights: dict[str, int] = {HOST: layout.input_bytes}
        groups: dict[str, Counter[Signature]] = {}
        for device, first, past in ranges:
            weights[device] = weights.get(device, 0) + (
                self._layer_before[past] - self._layer_before[first]
            )
            experts_at = HOST if placement.experts_in_ram else device
            weights[experts_at] = weights.get(experts_at, 0) + (
                self._routed_before[past] - self._routed_before[first]
            )
            kinds = groups.setdefault(device, Counter())
            for sig, before in self._count_before.items():
                kinds[sig] += before[past] - before[first]
        weights[output_device] = weights.get(output_device, 0) + layout.output_bytes
        if layout.output_tied and output_device != HOST:
            weights[output_device] += layout.input_bytes
        if self.candidate.shape is not None:
            weights[HOST] += split.repack_extra(self.candidate.shape, placement, self.cpu)
        computes = frozenset(d for d, _, _ in ranges) | {output_device}
        result = (weights, groups, computes)
        self._placements[placement] = result
        return result

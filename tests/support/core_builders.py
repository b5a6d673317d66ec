"""Small builders for core tests: model shapes and layouts with known per-layer bytes."""

from __future__ import annotations

from fitbox.core.ask import Candidate, Speeds
from fitbox.core.sizing import ModelShape
from fitbox.core.split import Layout
from fitbox.core.types import (
    Device,
    DeviceKind,
    Footprint,
    ResidentState,
    ResidentView,
    Rung,
)

GiB = 1 << 30
MiB = 1 << 20


def shape(n_layer: int = 32, weights: int = 4 * GiB, n_ctx_train: int = 32768) -> ModelShape:
    return ModelShape(
        weights_bytes=weights,
        n_layer=n_layer,
        n_ctx_train=n_ctx_train,
        n_embd=4096,
        n_vocab=32000,
        n_head=32,
        kv_heads=(8,) * n_layer,
        key_length=128,
        value_length=128,
        n_ff=14336,
    )


def layout(n_layer: int, weights: int, moe_share: float = 0.0) -> Layout:
    per_layer = weights * 9 // 10 // n_layer
    routed = int(per_layer * moe_share)
    return Layout(
        layer_bytes=(per_layer - routed,) * n_layer,
        routed_bytes=(routed,) * n_layer,
        input_bytes=weights // 20,
        output_bytes=weights // 20,
        output_tied=False,
    )


def model(
    key: str,
    weights: int = 4 * GiB,
    *,
    n_layer: int = 32,
    quant: str = "Q8_0",
    moe: bool = False,
    four_bit: bool = False,
    speeds: tuple[tuple[Rung, Speeds], ...] = (),
    n_ctx_train: int = 32768,
    **extra: object,
) -> Candidate:
    return Candidate(
        key=key,
        quant=quant,
        shape=shape(n_layer, weights, n_ctx_train),
        layout=layout(n_layer, weights, 0.8 if moe else 0.0),
        four_bit=four_bit,
        speeds=speeds,
        **extra,  # type: ignore[arg-type]
    )


def smollm2(key: str = "smollm2", **extra: object) -> Candidate:
    """SmolLM2-135M-Instruct Q4_1 as ``models/`` reads its header (tests/test_multigpu_e2e.py
    checks these numbers against the real file): 30 layers, the output tied to the token
    embeddings, so the last GPU of a split also holds a copy of them."""
    n_layer, plain = 30, (False,) * 30
    return Candidate(
        key=key,
        quant="Q4_1",
        shape=ModelShape(
            weights_bytes=96_576_768,
            n_layer=n_layer,
            n_ctx_train=8192,
            n_embd=576,
            n_vocab=49152,
            n_head=9,
            kv_heads=(3,) * n_layer,
            key_length=64,
            value_length=64,
            swa_layers=plain,
            key_length_swa=64,
            value_length_swa=64,
            recurrent_layers=plain,
            n_ff=1536,
        ),
        layout=Layout(
            layer_bytes=(2_216_448,) * n_layer,
            routed_bytes=(0,) * n_layer,
            input_bytes=30_081_024,
            output_bytes=2304,
            output_tied=True,
        ),
        **extra,  # type: ignore[arg-type]
    )


def fixed(key: str, total: int, **extra: object) -> Candidate:
    """A candidate whose footprint does not depend on the window or placement."""
    return Candidate(key=key, fixed=Footprint(total, 0, 0, 0), **extra)  # type: ignore[arg-type]


def gpu(i: int, capacity: int) -> Device:
    return Device(f"gpu{i}", DeviceKind.GPU, capacity, simulated=True)


def host(capacity: int) -> Device:
    return Device("host", DeviceKind.HOST, capacity)


def resident(
    key: str,
    size: int,
    *,
    device: str = "host",
    calls: int = 0,
    last_used: float = 0.0,
    state: ResidentState = ResidentState.READY,
    pinned: bool = False,
    **extra: object,
) -> ResidentView:
    return ResidentView(key, device, size, state, calls, last_used, pinned, **extra)  # type: ignore[arg-type]

"""Per-device bytes for a placement: llama.cpp's layer assignment, proven on generated
layouts (no GPU needed: the rule is arithmetic over -ngl and -ts)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fitbox.core.sizing import ModelShape
from fitbox.core.split import HOST, Layout, Placement, footprint_by_device, layer_devices

SHAPE = ModelShape(0, 4, 4096, 64, 100, 4, (2, 2, 2, 2), 16, 16)
LAYOUT = Layout(
    layer_bytes=(10, 10, 10, 10),
    routed_bytes=(5, 5, 5, 5),
    input_bytes=7,
    output_bytes=3,
    output_tied=False,
)


def test_no_gpu_layers_keep_everything_on_the_host() -> None:
    assert layer_devices(4, Placement(("gpu0",), gpu_layers=0)) == ((HOST,) * 4, HOST)


def test_the_output_layer_is_offloaded_first() -> None:
    # gguf-parser-go #42: i_gpu_start = max(n_layer + 1 - ngl, 0)
    assert layer_devices(4, Placement(("gpu0",), gpu_layers=1)) == ((HOST,) * 4, "gpu0")
    assert layer_devices(4, Placement(("gpu0",), gpu_layers=2)) == (
        (HOST, HOST, HOST, "gpu0"),
        "gpu0",
    )


def test_tensor_split_follows_cumulative_shares() -> None:
    layers, output = layer_devices(4, Placement(("gpu0", "gpu1"), gpu_layers=99))
    assert layers == ("gpu0", "gpu0", "gpu0", "gpu1") and output == "gpu1"
    layers, _ = layer_devices(
        4, Placement(("gpu0", "gpu1"), gpu_layers=99, tensor_split=(3.0, 1.0))
    )
    assert layers == ("gpu0", "gpu0", "gpu0", "gpu0")


def test_bytes_land_where_their_layer_is() -> None:
    full = footprint_by_device(SHAPE, LAYOUT, Placement(("gpu0",), gpu_layers=99), 4096, 1)
    assert full[HOST].weights == 7 and full["gpu0"].weights == 4 * 15 + 3
    assert full[HOST].kv == 0 and full["gpu0"].kv > 0
    moe = footprint_by_device(
        SHAPE, LAYOUT, Placement(("gpu0",), gpu_layers=99, experts_in_ram=True), 4096, 1
    )
    assert moe[HOST].weights == 7 + 4 * 5 and moe["gpu0"].weights == 4 * 10 + 3
    tied = Layout(LAYOUT.layer_bytes, LAYOUT.routed_bytes, 7, 3, output_tied=True)
    on_gpu = footprint_by_device(SHAPE, tied, Placement(("gpu0",), gpu_layers=99), 4096, 1)
    assert on_gpu["gpu0"].weights == 4 * 15 + 3 + 7  # token_embd duplicated for the output


@given(
    ngl=st.integers(0, 8),
    gpus=st.integers(0, 3),
    experts=st.booleans(),
    shares=st.lists(st.floats(0.1, 10), min_size=3, max_size=3),
)
def test_every_byte_is_placed_once(ngl: int, gpus: int, experts: bool, shares: list[float]) -> None:
    ids = tuple(f"gpu{i}" for i in range(gpus))
    placement = Placement(ids, ngl, tuple(shares[:gpus]), experts)
    split = footprint_by_device(SHAPE, LAYOUT, placement, 4096, 1)
    total = sum(LAYOUT.layer_bytes) + sum(LAYOUT.routed_bytes) + 7 + 3
    assert sum(f.weights for f in split.values()) == total
    whole = footprint_by_device(SHAPE, LAYOUT, Placement(), 4096, 1)[HOST]
    assert sum(f.kv for f in split.values()) == whole.kv  # KV follows layers, none lost

from __future__ import annotations

import pytest

from fitbox.units import format_bytes, parse_size


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("24GiB", 24 << 30),
        ("512MiB", 512 << 20),
        ("1.5G", 1_500_000_000),
        ("100", 100),
        ("8 gib", 8 << 30),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["lots", "", "12XB", "-1G"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_format_bytes() -> None:
    assert format_bytes(2 << 30) == "2.00 GiB"
    assert format_bytes(10) == "10 B"

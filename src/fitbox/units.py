"""Human sizes: parse '8GiB', '512M', '1.5G'; print bytes the way operators read them."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
# what parse_size reads, as a JSON schema pattern (/openapi.json's size settings)
SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([bB]|[kKmMgGtT]([iI]?[bB])?)?\s*$"


def parse_size(text: str) -> int:
    """'24GiB' -> 25769803776. Bare numbers are bytes; 'G' is 10^9, 'GiB' is 2^30."""
    match = _SIZE.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size; write it like 8GiB, 512MiB or 2000000000")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(n: int) -> str:
    """2147483648 -> '2.00 GiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"

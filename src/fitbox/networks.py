"""Address networks as settings spell them: parsed once, by config and by the trust rules."""

from __future__ import annotations

import ipaddress

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# loopback, the private IPv4 ranges, IPv6 unique-local and link-local
DEFAULT_TRUSTED_NETWORKS = (
    "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fd00::/8,fe80::/10"
)


def parse_networks(text: str) -> tuple[Network, ...]:
    """'10.0.0.0/8,192.168.1.5' -> networks; raises ValueError naming the bad entry."""
    networks = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(f"{part!r} is not an address or network") from None
    return tuple(networks)

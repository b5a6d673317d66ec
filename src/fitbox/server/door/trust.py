"""Who is calling (``origin_of``, pure): the box itself, a trusted network, or the outside.

- The box itself: a peer at 127.0.0.1 / ::1, or at the address the service listens on.
- A request carrying forwarding headers counts as outside unless its immediate peer is a
  trusted proxy; only then is X-Forwarded-For believed (walked from the right, skipping
  trusted proxies). A public proxy can never make the internet local.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from fitbox.networks import Network

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")
_SELF = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


@functools.lru_cache(maxsize=1024)  # every request parses its peer: ipaddress is slow
def parse_address(text: str | None) -> Address | None:
    if not text:
        return None
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def within(address: Address | None, networks: tuple[Network, ...]) -> bool:
    return address is not None and any(address in net for net in networks)


@dataclass(frozen=True, eq=False)  # hashed by identity: a cache key each request, made once
class TrustSettings:
    trusted_networks: tuple[Network, ...]
    trusted_proxies: tuple[Network, ...]
    listen_host: str
    host_names: tuple[str, ...] = ()  # FITBOX_HOST_NAMES: what a keyless Host may name
    allowed_origins: tuple[str, ...] = ()  # FITBOX_CORS_ORIGINS: pages the operator lets in


@dataclass(frozen=True)
class Origin:
    address: Address | None
    local: bool  # the box itself
    trusted: bool  # inside a trusted network
    forwarded: bool  # forwarding headers were present
    reason: str  # how it was classified, for refusals a person can act on


def origin_of(peer: str | None, headers: Mapping[str, str], settings: TrustSettings) -> Origin:
    peer_address = parse_address(peer)
    forwarded = any(h in headers for h in FORWARDING_HEADERS)
    if forwarded and not within(peer_address, settings.trusted_proxies):
        return Origin(
            peer_address,
            local=False,
            trusted=False,
            forwarded=True,
            reason=f"forwarded by {peer}, which is not a trusted proxy",
        )
    if not forwarded:
        return _classified(peer_address, settings)
    address = peer_address
    if forwarded:
        hops = [h.strip() for h in headers.get("x-forwarded-for", "").split(",") if h.strip()]
        client = None
        for hop in reversed(hops):
            hop_address = parse_address(hop)
            if hop_address is None:
                break  # garbage in the chain: trust nothing further left
            client = hop_address
            if not within(hop_address, settings.trusted_proxies):
                break
        address = client
        if address is None:
            return Origin(
                None,
                local=False,
                trusted=False,
                forwarded=True,
                reason="a trusted proxy sent no usable X-Forwarded-For",
            )
    return _classified(address, settings, forwarded=True)


@functools.lru_cache(maxsize=1024)  # a client's peer address, classified once
def _classified(
    address: Address | None, settings: TrustSettings, forwarded: bool = False
) -> Origin:
    local = address is not None and (
        address in _SELF or address == parse_address(settings.listen_host)
    )
    trusted = within(address, settings.trusted_networks)
    where = (
        "the box itself"
        if local
        else ("a trusted network" if trusted else "outside the trusted networks")
    )
    return Origin(
        address, local=local, trusted=trusted, forwarded=forwarded, reason=f"{address} is {where}"
    )

"""Who is calling: the trust rules as pure functions."""

from __future__ import annotations

from fitbox.networks import DEFAULT_TRUSTED_NETWORKS, parse_networks
from fitbox.server.door.auth import TrustSettings, origin_of

SETTINGS = TrustSettings(parse_networks(DEFAULT_TRUSTED_NETWORKS), (), "192.168.1.20")
BEHIND_PROXY = TrustSettings(
    parse_networks(DEFAULT_TRUSTED_NETWORKS), parse_networks("127.0.0.1"), "127.0.0.1"
)


def test_the_box_itself_is_loopback_or_the_listen_address() -> None:
    for peer in ("127.0.0.1", "::1", "192.168.1.20", "::ffff:127.0.0.1"):
        assert origin_of(peer, {}, SETTINGS).local, peer
    other_loopback = origin_of("127.0.0.3", {}, SETTINGS)
    assert not other_loopback.local and other_loopback.trusted


def test_trusted_networks_are_not_local() -> None:
    lan = origin_of("10.1.2.3", {}, SETTINGS)
    assert lan.trusted and not lan.local
    internet = origin_of("203.0.113.9", {}, SETTINGS)
    assert not internet.trusted and not internet.local
    assert "outside the trusted networks" in internet.reason


def test_forwarding_headers_from_an_untrusted_peer_make_it_outside() -> None:
    spoof = origin_of("127.0.0.1", {"x-forwarded-for": "127.0.0.1"}, SETTINGS)
    assert not spoof.local and not spoof.trusted and spoof.forwarded
    assert "not a trusted proxy" in spoof.reason
    assert not origin_of("127.0.0.1", {"forwarded": "for=10.0.0.1"}, SETTINGS).trusted


def test_a_trusted_proxy_is_believed_from_the_right() -> None:
    headers = {"x-forwarded-for": "10.9.9.9, 203.0.113.7"}
    client = origin_of("127.0.0.1", headers, BEHIND_PROXY)
    assert str(client.address) == "203.0.113.7" and not client.trusted and not client.local
    lan = origin_of("127.0.0.1", {"x-forwarded-for": "192.168.5.5"}, BEHIND_PROXY)
    assert lan.trusted and not lan.local
    garbage = origin_of("127.0.0.1", {"x-forwarded-for": "not-an-ip"}, BEHIND_PROXY)
    assert garbage.address is None and not garbage.trusted


def test_a_public_proxy_never_makes_the_internet_local() -> None:
    public_proxy = TrustSettings(
        SETTINGS.trusted_networks, parse_networks("198.51.100.1"), "0.0.0.0"
    )
    claim = origin_of("198.51.100.1", {"x-forwarded-for": "203.0.113.50"}, public_proxy)
    assert not claim.local and not claim.trusted

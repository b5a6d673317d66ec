"""A box joining a central (``FITBOX_CENTRAL_URL``): it registers its persistent id, name,
version, address and box key at start, and keeps trying in the background until the
central takes it. A central that refuses or cannot be reached never stops the box: it is
logged, with the central's reason, and tried again (a refusal less often than a cut)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httpx

import fitbox
from fitbox.store.box_key import write_secret
from fitbox.store.db import CentralKey

log = logging.getLogger(__name__)
RETRY_FIRST_S = 1.0
RETRY_MOST_S = 30.0
KEY_WATCH_S = 5.0  # how often the box key file is looked at for a rotated key (one stat)
REFUSED_RETRY_S = 60.0  # a refusal (bad key, a loopback box) waits on a person: ask less often
# which of the central's keys a call it forwards was made with: "KEY_ID NAME", the name
# percent-encoded (server/inference/openai.py records it on the call's row)
CENTRAL_KEY_HEADER = "x-fitbox-central-key"


def central_key_header(key_id: str, name: str) -> str:
    """The value the central sends in ``CENTRAL_KEY_HEADER`` for one of its keys."""
    return f"{key_id} {quote(name, safe='')}"


def central_key_of(headers: Mapping[str, str], api_key: Any) -> CentralKey | None:
    """The central key a call was made with, as its central said it, or None. Believed
    only on a request made with this box's own key (``api_key.is_box_key``): the box hands
    it to its central at registration and to no one else, so the central's word cannot be
    borrowed by another caller, whose header is ignored."""
    said = headers.get(CENTRAL_KEY_HEADER)
    if not said or api_key is None or not getattr(api_key, "is_box_key", False):
        return None
    key_id, _, name = said.strip().partition(" ")
    if not key_id:
        return None
    return CentralKey(key_id[:64], unquote(name)[:256])


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def reachable_address(host: str, port: int, central_url: str) -> str:
    """The URL a central can call this box on. A box bound to every address (0.0.0.0, ::)
    names the one its route to the central leaves from (no packet is sent: a UDP connect
    only picks the route)."""
    if host in ("0.0.0.0", "::", ""):
        target = urlsplit(central_url).hostname or "127.0.0.1"
        family = socket.AF_INET6 if ":" in target else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((target, 9))
                host = probe.getsockname()[0]
        except OSError:
            host = socket.gethostname()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class Registration:
    central_url: str
    central_key: str
    box_id: str
    name: str
    address: str
    box_key: str
    secret_file: Path | None = None  # the box's proof of identity (central/identity.py)
    box_key_file: Path | None = None  # watched: a rotated box key is registered again

    def body(self) -> dict[str, str]:
        found = {
            "box_id": self.box_id,
            "name": self.name,
            "version": fitbox.__version__,
            "url": self.address,
            "admin_key": self.box_key,
        }
        secret = self.secret()
        if secret:
            found["box_secret"] = secret
        return found

    def secret(self) -> str | None:
        if self.secret_file is None:
            return None
        try:
            return self.secret_file.read_text().strip() or None
        except FileNotFoundError:
            return None  # never joined: the central mints one
        except OSError as exc:  # the central refuses a known id without it, and says so
            log.warning("this box's proof of identity cannot be read: %s", exc)
            return None

    def keep_secret(self, answer: object) -> None:
        """Write the secret a first registration was given (told this once)."""
        secret = answer.get("box_secret") if isinstance(answer, dict) else None
        if self.secret_file is None or not isinstance(secret, str):
            return
        write_secret(self.secret_file, secret)
        log.info("the central's proof of this box's identity written to %s", self.secret_file)

    def loopback_problem(self) -> str | None:
        """Why a central elsewhere could never call this box back, if it could not."""
        box_host = urlsplit(self.address).hostname or ""
        central_host = urlsplit(self.central_url).hostname or ""
        if is_loopback(box_host) and not is_loopback(central_host):
            return (
                f"this box listens on loopback only ({self.address}), so the central at "
                f"{self.central_url} could never reach it; start it with --host 0.0.0.0 "
                "(or an address the central can reach)"
            )
        return None


async def register_once(reg: Registration) -> tuple[bool, str]:
    """(taken, what happened in words)."""
    headers = {"Authorization": f"Bearer {reg.central_key}"} if reg.central_key else {}
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(
                f"{reg.central_url}/v1/boxes", json=reg.body(), headers=headers
            )
    except httpx.HTTPError as exc:
        return False, f"the central at {reg.central_url} could not be reached ({exc!r})"
    if response.status_code >= 400:
        try:
            reason = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = response.text[:300]
        return False, (
            f"the central at {reg.central_url} refused this box (HTTP "
            f"{response.status_code}): {reason}"
        )
    try:
        reg.keep_secret(response.json())
    except (ValueError, OSError) as exc:
        # the central holds this box's secret now, and the box does not: it will be refused
        # until a person removes it there (fitbox central boxes remove ID)
        log.error("the central's proof of this box's identity could not be kept: %s", exc)
    return True, f"registered with the central at {reg.central_url} as {reg.box_id}"


async def keep_registering(reg: Registration) -> None:
    """Register until the central takes this box, and again with each new box key (a task
    the serve cancels at its end)."""
    problem = reg.loopback_problem()
    if problem:
        log.error("not registering with the central: %s", problem)
        return
    while True:
        await _until_taken(reg)
        if reg.box_key_file is None:
            return
        reg = await _key_rotated(reg)


async def _until_taken(reg: Registration) -> None:
    wait = RETRY_FIRST_S
    while True:
        taken, said = await register_once(reg)
        if taken:
            log.info("%s", said)
            return
        refused = "refused" in said
        log.warning("%s; trying again in %.0f s", said, REFUSED_RETRY_S if refused else wait)
        await asyncio.sleep(REFUSED_RETRY_S if refused else wait)
        wait = min(wait * 2, RETRY_MOST_S)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns


async def _key_rotated(reg: Registration) -> Registration:
    """Once the box key file holds another key than the one registered (`fitbox keys
    rotate-box` revokes the old one at once, and the central calls the box with it): the
    registration with the new one, so the central has it within ``KEY_WATCH_S``, not at the
    box's next start. One stat of the file each time; it is read only when it changed."""
    assert reg.box_key_file is not None
    seen = _stamp(reg.box_key_file)
    while True:
        await asyncio.sleep(KEY_WATCH_S)
        now = _stamp(reg.box_key_file)
        if now == seen:
            continue
        seen = now
        try:
            key = reg.box_key_file.read_text().strip()
        except OSError:
            continue
        if key and key != reg.box_key:
            log.info("the box key changed: registering the new one with the central")
            return replace(reg, box_key=key)

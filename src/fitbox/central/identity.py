"""A box's proof of identity at the central. Box ids are public (``x-fitbox-box``,
``/health``) and a worker key sits on every box's command line, so neither proves which box
is registering: at a box's first registration the central mints a secret, returns it once
(the box keeps it beside its box key, mode 0600) and keeps only its sha256. Every later
registration of that id must present it; one that does not is refused and the box on record
is left as it was.

A box registered before the central kept secrets has none on record: its first register
from the address on record is taken and given one (that box was already there); one from
any other address is refused, since a move and a takeover look alike without proof. A box
that never kept the secret it was minted (the answer lost) asks again from the same address
with the same box key, and is given another. A box that lost its secret and moved is
removed by a person (``fitbox central boxes remove ID``) and joins again."""

from __future__ import annotations

import hashlib
import hmac
import secrets

import httpx

from fitbox.errors import Conflict, PermissionDenied

TWIN_PROBE_S = 3.0  # the box on record is asked this long whether it still answers
SECRET_PREFIX = "fbx_box_"  # noqa: S105 (a prefix that names what the text is, no secret)


class BoxIdentityRefused(PermissionDenied):
    """A registration names a box id the central knows without that box's proof."""

    code = "box_identity_unproven"


def mint() -> tuple[str, str]:
    """A new secret and the hash the central keeps of it."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    return secret, digest(secret)


def digest(secret: str) -> str:
    # 256 random bits: a plain hash is enough, nothing to stretch against guessing
    return hashlib.sha256(secret.encode()).hexdigest()


def proven(presented: str | None, on_record: str | None) -> bool:
    """Whether ``presented`` is the secret whose hash is on record (constant time)."""
    return on_record is not None and hmac.compare_digest(digest(presented or ""), on_record)


def check(
    box_id: str,
    url: str,
    presented: str | None,
    on_record: str | None,
    url_on_record: str,
    same_box_key: bool,
) -> bool:
    """Raise BoxIdentityRefused unless this registration may speak for ``box_id``; True
    when the box needs a secret minted: it has none on record, or it never got the one
    minted (an answer lost, a crash before the box wrote it) and proves itself by the
    address and the box key on record, which a borrower of the public id does not have."""
    if on_record is not None:
        if proven(presented, on_record):
            return False
        if presented is None and url == url_on_record and same_box_key:
            return True
        why = "presented a wrong secret" if presented else "presented no secret"
    elif url == url_on_record:
        return True
    else:
        why = f"has no secret on record and this registration comes from {url}"
    raise BoxIdentityRefused(
        f"Box {box_id} is registered at {url_on_record}, and this registration {why}: "
        "only that box can register its id again (it keeps its secret in its home, "
        "central.secret). A copy of a box's home must not reuse its id; a box that lost its "
        f"secret is removed first: fitbox central boxes remove {box_id}.",
        param="box_id",
    )


class BoxIdInUse(Conflict):
    """A box answering at its address on record presents the id another registers."""

    code = "box_id_in_use"


async def refuse_a_live_twin(
    client: httpx.AsyncClient, box_id: str, url_on_record: str, url: str
) -> None:
    """A registration of ``box_id`` from ``url`` while the box on record still answers as
    that id at ``url_on_record`` (and names another address than ``url`` as its own): two
    boxes with one id and one secret, a whole disk cloned (same machine id, path and inode,
    which box_identity.py cannot tell apart). The second is refused; nothing is mixed."""
    try:
        response = await client.get(f"{url_on_record}/health", timeout=TWIN_PROBE_S)
        health = response.json()
    except (httpx.HTTPError, ValueError):
        return  # gone: a box that moved
    if not isinstance(health, dict) or health.get("box_id") != box_id:
        return  # another box took its old port
    if health.get("address") == url:
        return  # the same box, now named by another of its addresses
    raise BoxIdInUse(
        f"Box {box_id} answers at {url_on_record}, and a box at {url} registers the same id "
        "with the same proof: a copy of its disk (a cloned machine). Give the copy a machine "
        "id of its own (systemd-machine-id-setup) and restart it: it then takes an id of its "
        "own; or stop the box at the old address if this is a move.",
        param="box_id",
    )

"""How a setting's text (environment, command line) becomes its value: the parsers the
settings table (fitbox.config) names, each raising ValueError with a reason that ConfigError
then puts beside the setting's name and value; each parser's type in words (``KINDS``); and
``Setting``, one row of that table."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fitbox.units import parse_size


class ConfigError(ValueError):
    """A setting has a value fitbox cannot use."""


def port(text: str) -> int | None:
    if text == "auto":
        return None
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError("a port is 1..65535 or 'auto'")
    return port


def paths(text: str) -> tuple[Path, ...]:
    return tuple(Path(p).expanduser().absolute() for p in text.split(os.pathsep) if p)


def optional_size(text: str) -> int | None:
    return parse_size(text) if text else None


def optional_positive_int(text: str) -> int | None:
    return positive_int(text) if text else None


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def yes_no(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("write true or false")


def kv_types(text: str) -> tuple[str, ...]:
    from fitbox.core.sizing import KV_TYPES

    kinds = tuple(k.strip().lower() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KV_TYPES]
    if unknown or not kinds:
        raise ValueError(f"cache types are a comma list of {', '.join(KV_TYPES)}")
    return kinds


def positive_size(text: str) -> int:
    value = parse_size(text)
    if value < 1:
        raise ValueError("must be at least 1 byte")
    return value


DRIVE_ROLES = ("central", "worker", "immutable")


def drive_roles(text: str) -> tuple[tuple[Path, str], ...]:
    """``DIR=role,DIR=role``: the role of the drive holding each directory."""
    found = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        where, eq, role = item.rpartition("=")
        if not eq or not where or role not in DRIVE_ROLES:
            raise ValueError(
                f"write DIR=ROLE pairs, comma-separated; a role is one of {', '.join(DRIVE_ROLES)}"
            )
        found.append((Path(where).expanduser(), role))
    return tuple(found)


MOVERS = ("reap_to_fit", "upload_to_worker", "copy_to_central")


def movers(text: str) -> frozenset[str]:
    """A comma list of movers to turn on (each is off unless named)."""
    named = frozenset(m.strip() for m in text.split(",") if m.strip())
    unknown = sorted(named - set(MOVERS))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a mover; the movers are {', '.join(MOVERS)}")
    return named


def origins(text: str) -> tuple[str, ...]:
    origins = tuple(o.strip().rstrip("/") for o in text.split(",") if o.strip())
    if "*" in origins and len(origins) > 1:
        raise ValueError("write * alone, or a list of origins")
    for origin in origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise ValueError(f"an origin is scheme://host[:port]; {origin!r} is not one")
    return origins


def host_names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip().lower().rstrip(".") for n in text.split(",") if n.strip())
    for name in names:
        if not name or any(c in name for c in "/:@ *"):
            raise ValueError(
                f"a host name is a bare name (fitbox.lan), no scheme or port; {name!r} is not one"
            )
    return names


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be above 0")
    return value


# Each text parser's type, in words, for the reference (docs/reference/settings.md)
KINDS: dict[Callable[[str], Any], str] = {
    str: "text",
    port: "port (1..65535) or auto",
    paths: "directories, os.pathsep-separated",
    optional_size: "size (e.g. 8GiB), or unset",
    optional_positive_int: "integer >= 1, or unset",
    positive_int: "integer >= 1",
    yes_no: "true or false",
    kv_types: "cache types, comma list",
    positive_size: "size (e.g. 32MiB)",
    drive_roles: "DIR=ROLE, comma list",
    movers: "movers, comma list",
    origins: "origins, comma list, or *",
    host_names: "host names, comma list",
    positive_float: "number > 0",
}


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            raise ValueError(f"write one of {', '.join(allowed)}")
        return value

    KINDS[parse] = f"one of {', '.join(allowed)}"
    return parse


# Where a setting can be set besides the environment: the settings API's scopes
# (POST /v1/settings/box, /v1/settings/pair, /v1/settings/key, /v1/limits)
BOX, PAIR, KEY, LIMITS = "box", "pair", "key", "limits"


@dataclass(frozen=True)
class Setting:
    """One setting, declared once. ``env`` is "" for a knob only the settings API sets;
    ``flag`` is its command-line option ("" for none); ``api`` parses its JSON value in the
    settings API's ``scopes`` (box/preferences.py derives its knobs from them)."""

    name: str
    env: str
    default: str
    help: str
    parse: Callable[[str], Any] = str
    flag: str = ""
    scopes: tuple[str, ...] = ()
    api: Callable[[Any], Any] | None = None
    kind: str = ""  # a knob only the API sets says its type; else the text parser's (KINDS)
    secret: bool = False  # a key or a password: fitbox settings never prints its value

    @property
    def type(self) -> str:
        return self.kind or KINDS.get(self.parse, "text")

    @property
    def where(self) -> tuple[str, ...]:
        """Every place it can be set: env, flag, then the settings API's scopes."""
        return (("env",) if self.env else ()) + (("flag",) if self.flag else ()) + self.scopes

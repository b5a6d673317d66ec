"""Whether the service's user can reach what a system unit runs: the unit starts the
interpreter that ran `fitbox install --system` (its ExecStart) as the fitbox user with a
private /tmp (hardening.py), so an interpreter, or the fitbox it imports, under /tmp or
/var/tmp, or behind a directory that user may not pass (/root is 0700), would install a
service that never starts. `fitbox install --system` refuses it before writing anything."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

# PrivateTmp=yes: the service sees its own (names of directories, nothing is made there)
PRIVATE = (Path("/tmp"), Path("/var/tmp"))  # noqa: S108
EXECUTE, READ = 1, 4  # the bits of one rwx triplet


@dataclass(frozen=True)
class Account:
    """Who the service runs as; ``uid`` None: not made yet (a new system user owns nothing
    and is in no group but its own, so only what any user may do counts)."""

    name: str
    uid: int | None
    gids: frozenset[int]


def account(name: str = "fitbox") -> Account:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return Account(name, None, frozenset())
    groups = {g.gr_gid for g in grp.getgrall() if name in g.gr_mem}
    return Account(name, entry.pw_uid, frozenset({entry.pw_gid, *groups}))


def _allows(info: os.stat_result, who: Account, bit: int) -> bool:
    if who.uid == 0:
        return True
    if who.uid is not None and info.st_uid == who.uid:
        shift = 6
    else:
        shift = 3 if info.st_gid in who.gids else 0
    return info.st_mode >> shift & bit == bit


def _owner(info: os.stat_result) -> str:
    try:
        return pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        return str(info.st_uid)


def _blocked(path: Path, who: Account, bit: int) -> str | None:
    """Why ``who`` cannot reach ``path`` (as written, then with its links resolved) with
    ``bit`` on the path itself; None when it can."""
    for seen in dict.fromkeys((Path(os.path.abspath(path)), path.resolve())):
        hidden = next((p for p in PRIVATE if seen == p or p in seen.parents), None)
        if hidden is not None:
            return (
                f"{seen} is under {hidden}, which the service does not see "
                "(its unit gives it a private /tmp and /var/tmp: PrivateTmp=yes)"
            )
        for step in [*reversed(seen.parents), seen]:
            info = step.stat()
            wanted = bit if step == seen else EXECUTE
            if not _allows(info, who, wanted):
                what = "read" if wanted == READ else ("run" if step == seen else "pass")
                return (
                    f"the {who.name} user may not {what} {step} (mode "
                    f"{stat.filemode(info.st_mode)}, owner {_owner(info)}), so the service "
                    f"cannot reach {seen}"
                )
    return None


def unreachable(interpreter: Path, package: Path, who: Account) -> str | None:
    """The reason the service cannot start ``interpreter`` importing fitbox from
    ``package`` as ``who``, with what to do instead; None when it can."""
    why = _blocked(interpreter, who, EXECUTE) or _blocked(package, who, READ | EXECUTE)
    if why is None:
        return None
    return (
        f"{why}. Install the service from a Python environment the {who.name} user can "
        "reach, outside /tmp, /var/tmp and private home directories (e.g. "
        "`python3 -m venv /opt/fitbox/venv`), or use the Debian package"
    )

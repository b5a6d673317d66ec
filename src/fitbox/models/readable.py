"""Why fitbox cannot read a file or folder, in words an operator can act on.

A model file or a models folder fitbox cannot read is data, not a crash: the catalog lists
it with this reason (``fitbox models``, ``GET /v1/models``, ``/health``) and a call naming
it gets the same reason instead of "does not exist". The reason names who fitbox runs as
and who owns the path with which mode, since that is what a ``chmod`` or ``chown`` fixes.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from pathlib import Path


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def is_unreadable(exc: OSError) -> bool:
    """A read refused by permissions (not a file that is gone)."""
    return exc.errno in (errno.EACCES, errno.EPERM)


def unreadable_reason(path: Path, exc: OSError) -> str:
    """``path`` could not be read (``exc``): what was refused, its owner and mode, and who
    fitbox runs as. A path whose own metadata cannot be read says so too."""
    what = "folder" if _is_dir(path) else "file"
    said = exc.strerror or str(exc)
    try:
        st = os.stat(path)
        owned = (
            f"owner {_user(st.st_uid)}, group {_group(st.st_gid)}, "
            f"mode {stat.filemode(st.st_mode)} ({stat.S_IMODE(st.st_mode):04o})"
        )
    except OSError as inner:
        owned = f"its owner and mode cannot be read either ({inner.strerror or inner})"
    return (
        f"fitbox cannot read the {what} {path}: {said}; {owned}; fitbox runs as "
        f"{_user(os.geteuid())}. Give that user read access to it (and search access to "
        "the folders above it)"
    )


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False

"""fitbox started as a process that file permissions bind, where the tests run as root.

Root reads any file whatever its mode (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so a mode
0000 file is no unreadable file for it. ``without_read_override()`` starts fitbox through
util-linux's setpriv with those two capabilities dropped from its bounding and inheritable
sets: it stays uid 0, owns what the test made (its home, the tiny GGUFs), and a file or
folder the test sets to mode 0000 refuses it with EACCES, as it refuses a service user.
Staying uid 0 keeps everything else the test made (the venv, the engine, the cache)
readable as it is, where a switch to ``nobody`` would need each of them opened to it.
"""

from __future__ import annotations

import os
import shutil

import pytest

DROPPED = "-dac_override,-dac_read_search"


def without_read_override() -> tuple[str, ...]:
    """The setpriv prefix (none for a test run as another user: modes bind it already);
    skips the test where setpriv is missing."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("util-linux's setpriv is needed to run fitbox bound by file modes")
    return (setpriv, "--bounding-set", DROPPED, "--inh-caps", DROPPED)

"""Where the tests find the repository, their model cache and the in-process box."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache"))
# the fake engines (shell and Python scripts standing in for llama-server and others)
FAKES = REPO / "tests" / "fakes"
# an in-process app's base URL: its Host names the box, as the box's own browser would
# (a keyless call from loopback naming another host is refused: server/door/auth.py box_host)
BOX = "http://127.0.0.1"

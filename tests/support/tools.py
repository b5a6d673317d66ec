"""Outside programs some tests drive (prometheus, chromium): found, or a clear word why not.

.ci/run installs them and sets FITBOX_REQUIRE_TOOLS=1, so in CI a missing one fails the
test; on a developer's machine without it the test is skipped, naming the package."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def required_tool(command: str, debian_package: str) -> Path:
    found = shutil.which(command)
    if found:
        return Path(found)
    why = f"'{command}' is not installed: apt-get install -y {debian_package}"
    if os.environ.get("FITBOX_REQUIRE_TOOLS"):
        pytest.fail(why)
    pytest.skip(why)

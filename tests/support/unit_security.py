"""`systemd-analyze security --offline=true` on a unit file: its overall exposure, the
level systemd names (PERFECT, SAFE, OK, MEDIUM, EXPOSED, UNSAFE, DANGEROUS) and the
settings it counts as exposures, each with the word a justifying comment must name."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .tools import required_tool

GOOD_LEVELS = ("PERFECT", "SAFE", "OK")
_OVERALL = re.compile(r"Overall exposure level for \S+: ([\d.]+) (\w+)")


@dataclass(frozen=True)
class Rating:
    exposure: float
    level: str
    exposed: tuple[str, ...]  # "PrivateNetwork=", "SystemCallFilter=~@resources", ...


def rate(unit: Path) -> Rating:
    analyze = required_tool("systemd-analyze", "systemd")
    done = subprocess.run(
        [str(analyze), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = _OVERALL.search(done.stdout)
    assert found, done.stdout + done.stderr
    exposed = tuple(line.split()[1] for line in done.stdout.splitlines() if line.startswith("✗"))
    return Rating(float(found.group(1)), found.group(2), exposed)


def named_in_comment(setting: str) -> str:
    """The word a comment justifying ``setting`` names: "SystemCallFilter=~@resources" ->
    "@resources", "RestrictAddressFamilies=~AF_(INET|INET6)" -> "AF_INET",
    "RootDirectory=/RootImage=" -> "RootDirectory", "UMask=" -> "UMask"."""
    key, _, rest = setting.partition("=")
    if rest.startswith("~"):
        return re.sub(r"[()]", "", rest[1:]).split("|")[0]
    return key


def unjustified(unit_text: str, rating: Rating) -> list[str]:
    comments = "\n".join(ln for ln in unit_text.splitlines() if ln.startswith("#"))
    return [s for s in rating.exposed if named_in_comment(s) not in comments]

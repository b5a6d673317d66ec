"""Capacity tiers: device >= box setting >= central setting (FORMULAS.md §Tiers).

The device tier is what the hardware has; the box tier is this box's own limit
(``--ram-max``, ``/v1/limits``); the central tier is what a central allots the box. Memory
that other processes use is charged to the device before any tier applies.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tier:
    resource: str  # "vram:gpu0", "ram", "cores", "storage"
    device: int
    box: int | None = None
    central: int | None = None

    def problems(self) -> list[str]:
        """Why these settings are refused: a setting above its parent tier."""
        found = []
        if self.box is not None and self.box > self.device:
            found.append(
                f"{self.resource}: the box setting {self.box} is above what the "
                f"device has ({self.device})"
            )
        parent_name, parent = (
            ("box setting", self.box) if self.box is not None else ("device", self.device)
        )
        if self.central is not None and self.central > parent:
            found.append(
                f"{self.resource}: the central setting {self.central} is above the "
                f"{parent_name} ({parent})"
            )
        return found

    def effective(self) -> int:
        """The least of the tiers: what fitbox may use of this resource at most."""
        return min(v for v in (self.device, self.box, self.central) if v is not None)


def capacity(tier: Tier, unmanaged: int = 0) -> int:
    """What fitbox may fill: the effective tier, less what other processes hold on the device
    (they count against the hardware, not against fitbox's allowance, unless it overlaps)."""
    return max(min(tier.effective(), tier.device - max(unmanaged, 0)), 0)


def check(resource: str, device: int, box: int | None, central: int | None = None) -> None:
    """Raise ValueError naming the tier a new setting breaks."""
    problems = Tier(resource, device, box, central).problems()
    if problems:
        raise ValueError("; ".join(problems))

"""Supervision: a child's bring-up, readiness and measurement, the hang watchdog, the
crash ledger and its backoff, waits for memory to come back, and orphans of an earlier
fitbox. Every engine kind's child goes through here (engines/seam.py)."""

from .supervisor import Supervisor
from .watchdog import Watchdog

__all__ = ["Supervisor", "Watchdog"]

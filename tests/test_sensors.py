"""Cores busy with other work: the sensor's sustained-reading threshold, and a real busy
process read by the real CPU counter.

The busy process spins, pinned to one core, until the test closes its stdin (the event that
holds it). Between two readings the test waits until the spinner itself has used more CPU
time: a reading always covers some of its work, however slow or loaded the machine is.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from fitbox.box.sensors import BusyCores, EngineCpu
from fitbox.core import claims
from fitbox.probe.host import CoreBusyCounter, physical_cores

from .support.holds import until

TWO = {0: frozenset({0, 2}), 1: frozenset({1, 3})}  # two cores with SMT siblings
SPIN = """
import os, select, sys
os.sched_setaffinity(0, {%d})
print("spinning", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    pass
"""


def test_a_core_is_busy_only_after_the_sustained_readings_and_one_reading_below_clears_it() -> None:
    busy = BusyCores(TWO, percent=90, readings=3)
    for _ in range(3):
        assert busy.busy() == ()  # fewer readings than the threshold: never busy
        busy.observe({0: 5.0, 1: 20.0, 2: 3.0, 3: 95.0}, held=())  # one sibling is enough
    assert busy.busy() == (1,)
    busy.observe({3: 89.0}, held=())
    assert busy.busy() == ()  # one reading below clears it
    for _ in range(3):
        busy.observe({1: 100.0}, held=())
    busy.observe({1: 100.0}, held=(1,))  # one of our engines took it: its use is not other work
    assert busy.busy() == ()


def test_other_work_on_cores_our_engines_hold_keeps_the_reserved_core_from_being_lent() -> None:
    """Both cores held by our engines (a swap's victim held them all): per core nothing is
    other work, but the box read whole is busier than our engines by a core's worth, so the
    reserved core is busy and a claim is not lent it; our engines' own use never counts."""
    cores = {0: frozenset({0}), 1: frozenset({1})}
    busy = BusyCores(cores, percent=90, readings=3)
    for _ in range(3):
        busy.observe({0: 100.0, 1: 100.0}, held=(0, 1), engines_percent=195.0)
    assert busy.busy() == ()  # all of it was ours
    for _ in range(3):
        assert claims.claim(
            (0, 1), busy.busy(), [], (), weights_in_ram=True, floor=1
        ) == claims.Claim((0, 1))
        busy.observe({0: 100.0, 1: 100.0}, held=(0, 1), engines_percent=100.0)
    assert busy.busy() == (0,)
    assert claims.claim((0, 1), busy.busy(), [], (), weights_in_ram=True, floor=1) == claims.Claim(
        (1,)
    )
    busy.observe({0: 100.0, 1: 100.0}, held=(0, 1), engines_percent=None)  # not read: stays
    assert busy.busy() == (0,)
    busy.observe({0: 60.0, 1: 100.0}, held=(0, 1), engines_percent=100.0)
    assert busy.busy() == ()  # one reading below clears it


def test_the_box_is_settled_only_after_as_many_quiet_readings_as_busy_must_last() -> None:
    """Busy clears at one reading below; settled (what widening an engine waits for) needs
    ``readings`` quiet ones in a row, and one busy reading starts the count again."""
    busy = BusyCores({0: frozenset({0}), 1: frozenset({1})}, percent=90, readings=3)
    assert not busy.settled()  # nothing read yet
    for _ in range(2):
        busy.observe({0: 50.0, 1: 100.0}, held=(1,), engines_percent=100.0)
    assert not busy.settled()
    busy.observe({0: 50.0, 1: 100.0}, held=(1,), engines_percent=100.0)
    assert busy.settled()
    busy.observe({0: 100.0, 1: 100.0}, held=(1,), engines_percent=100.0)  # a core's worth
    assert not busy.settled() and busy.busy() == ()  # not busy yet either
    busy.observe({0: 100.0, 1: 100.0}, held=(1,), engines_percent=None)  # not read: stays
    assert not busy.settled()


def test_our_engines_cpu_is_read_per_process_between_reads(
    spinner: tuple[psutil.Process, int],
) -> None:
    """A real process spinning on a core reads as about one core's worth while it spins."""
    process, _ = spinner
    engines = EngineCpu()
    engines.read([process.pid])
    before = process.cpu_times()
    until(lambda: sum(process.cpu_times()[:2]) - sum(before[:2]) >= 0.2, "the spinner ran")
    used = engines.read([process.pid, 2**22 + 7])  # a pid that is gone is skipped
    assert used is not None and 0 < used <= 110


@pytest.fixture
def spinner() -> Iterator[tuple[psutil.Process, int]]:
    cores = physical_cores()
    if len(cores) < 2:
        pytest.skip("needs two physical cores")
    cpu = min(cores[1])
    proc = subprocess.Popen(
        [sys.executable, "-c", SPIN % cpu], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "spinning\n"
    try:
        yield psutil.Process(proc.pid), cpu
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the event: the spinner sees EOF and ends
        proc.wait(timeout=60)
        proc.stdout.close()


def test_a_real_busy_process_makes_its_core_busy_with_other_work(
    spinner: tuple[psutil.Process, int],
) -> None:
    process, _ = spinner
    busy = BusyCores(physical_cores(), percent=90, readings=3)
    counter = CoreBusyCounter()
    counter.read()  # starts the counter

    def one_reading() -> None:
        spent = sum(process.cpu_times()[:2])
        until(lambda: sum(process.cpu_times()[:2]) >= spent + 0.05, "the spinner to compute")
        busy.observe(counter.read(), held=())

    for _ in range(2):
        one_reading()
        assert 1 not in busy.busy()  # not yet sustained
    one_reading()
    assert 1 in busy.busy()
    busy.observe(counter.read(), held=(1,))  # an engine of ours on it now
    assert 1 not in busy.busy()

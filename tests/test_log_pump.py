"""A child's log pipe: read as it comes while the child loads, in batches once it is ready,
everything kept in order, and a stop never waits out a pause.

The pump reads a real pipe; the pause between batches is held by the test (a pause longer
than any test, ended by the pump's own ``hurry``), so nothing here races a clock.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from fitbox.engines import child
from fitbox.engines.child import Child, _log_pipe, _LogPump


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every batch the pump reads, in order."""
    batches: list[bytes] = []
    read_all = child._read_all

    def counted(fd: int) -> tuple[bytes, bool]:
        data, closed = read_all(fd)
        batches.append(data)
        return data, closed

    monkeypatch.setattr(child, "_read_all", counted)
    return batches


async def _until(event: asyncio.Event) -> None:
    await event.wait()
    event.clear()


def test_a_ready_child_s_lines_are_read_in_one_batch_and_all_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(child, "SETTLED_READ_PAUSE_S", 3600.0)  # ended by hurry, not a clock
    batches = _counting_reads(monkeypatch)
    lines = [f"line {i} of a call\n".encode() for i in range(100)]

    async def run() -> None:
        read_end, write_end = _log_pipe()
        pump = _LogPump(tmp_path / "child.log", b"$ engine\n")
        task = asyncio.create_task(pump.run(read_end))
        os.write(write_end, b"loading\n")
        await _until(pump.printed)  # read as it came: the child is still loading
        pump.loading = False  # ready (wait_ready's flip)
        os.write(write_end, lines[0])
        await _until(pump.printed)  # the first line after ready: read, then the pause
        for line in lines[1:]:
            os.write(write_end, line)  # each its own write, as llama.cpp's log thread does
        pump.hurry.set()  # a stop: the pause ends, the rest is read at once
        await _until(pump.printed)
        os.close(write_end)
        async with asyncio.timeout(30):
            await task

    asyncio.run(run())
    assert batches[:3] == [b"loading\n", lines[0], b"".join(lines[1:])], batches[:4]
    assert batches[3:] == [b""]  # then the pipe's end, and nothing read line by line
    kept = (tmp_path / "child.log").read_bytes()
    assert kept == b"$ engine\nloading\n" + b"".join(lines)


def test_the_pipe_is_widened_and_never_handed_to_another_child() -> None:
    read_end, write_end = _log_pipe()
    try:
        assert not os.get_inheritable(read_end) and not os.get_inheritable(write_end)
        assert not os.get_blocking(read_end)
        if sys.platform == "linux":
            import fcntl

            assert fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ) in (child.PIPE_BYTES, 64 * 1024)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_stopped_child_s_last_lines_are_kept_without_waiting_out_the_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real process: it loads, is taken for ready, prints a line when the test asks
    (SIGUSR1) and its last one as it is stopped (SIGTERM); the stop returns with every line
    in the file and the tail, though the pause would last an hour."""
    monkeypatch.setattr(child, "SETTLED_READ_PAUSE_S", 3600.0)
    script = tmp_path / "engine.py"
    script.write_text(
        "import os, signal, time\n"
        "signal.signal(signal.SIGUSR1, lambda *_: os.write(1, b'a call\\n'))\n"
        "def leave(*_):\n"
        "    os.write(1, b'bye\\n')\n"
        "    os._exit(0)\n"
        "signal.signal(signal.SIGTERM, leave)\n"
        "os.write(1, b'loaded\\n')\n"
        "while True:\n"
        "    time.sleep(3600)\n"
    )
    engine = Child([sys.executable, str(script)], port=1, log_path=tmp_path / "e.log")

    async def run() -> int | None:
        await engine.start()
        assert engine._pump is not None and engine.pid is not None
        await _until(engine._pump.printed)  # "loaded": its handlers are in place
        engine._pump.loading = False
        os.kill(engine.pid, signal.SIGUSR1)
        await _until(engine._pump.printed)  # "a call" read: the pump is in its pause now
        async with asyncio.timeout(60):  # a bound for a broken build, not a race
            return await engine.stop(grace=30)

    assert asyncio.run(run()) == 0
    assert engine.tail()[-3:] == ["loaded", "a call", "bye"]
    assert (tmp_path / "e.log").read_bytes().endswith(b"loaded\na call\nbye\n")


def test_one_wake_up_reads_at_most_its_share_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child printing faster than the pump reads cannot hold the event loop in one read
    loop: each wake-up takes at most READ_AT_ONCE (made tiny here), the rest the next."""
    monkeypatch.setattr(child, "PIPE_BYTES", 4)
    monkeypatch.setattr(child, "READ_AT_ONCE", 8)
    batches = _counting_reads(monkeypatch)
    printed = bytes(range(32, 127))  # 95 bytes, in one write

    async def run() -> None:
        read_end, write_end = _log_pipe()
        pump = _LogPump(tmp_path / "child.log", b"")
        os.write(write_end, printed)
        os.close(write_end)
        async with asyncio.timeout(30):
            await pump.run(read_end)

    asyncio.run(run())
    assert all(len(batch) <= 8 for batch in batches) and len(batches) >= 12
    assert b"".join(batches) == printed == (tmp_path / "child.log").read_bytes()

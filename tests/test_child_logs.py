"""The engine children's log files (box/supervision/logs.py): pruned by age and total size,
never a running child's; read by name only, the last lines or from an offset."""

from __future__ import annotations

import os
from pathlib import Path

from fitbox.box.supervision.logs import ChildLogs

DAY = 86_400.0
NOW = 1_800_000_000.0


def _log(directory: Path, name: str, size: int, age_days: float) -> Path:
    path = directory / name
    path.write_bytes(b"x" * size)
    os.utime(path, (NOW - age_days * DAY, NOW - age_days * DAY))
    return path


def test_old_logs_go_then_the_oldest_until_the_rest_fit_and_a_running_one_stays(
    tmp_path: Path,
) -> None:
    running = _log(tmp_path, "smol-4001.log", 600, age_days=30)  # old and big: it runs
    _log(tmp_path, "smol-4001.log.1", 600, age_days=31)  # its rotated half runs with it
    _log(tmp_path, "smol-4002.log", 100, age_days=20)  # past the age
    _log(tmp_path, "qwen-4003.log", 300, age_days=3)
    _log(tmp_path, "qwen-4004.log", 300, age_days=2)
    _log(tmp_path, "qwen-4005.log", 300, age_days=1)
    (tmp_path / "notes.txt").write_text("not a child's log")
    logs = ChildLogs(tmp_path, max_age_s=14 * DAY, max_bytes=1_900)
    removed = logs.prune([running], now=NOW)
    # newest first: 300 + 300 + 600 (running) + 600 (running) = 1800; the 3-day one makes
    # 2100 > 1900 and goes; the 20-day one is past the age
    assert sorted(removed) == ["qwen-4003.log", "smol-4002.log"]
    left = {f.name: f.running for f in logs.files([running])}
    assert left == {
        "qwen-4005.log": False,
        "qwen-4004.log": False,
        "smol-4001.log": True,
        "smol-4001.log.1": True,
    }
    assert (tmp_path / "notes.txt").exists()


def test_a_log_is_named_never_pathed_and_read_by_tail_or_offset(tmp_path: Path) -> None:
    (tmp_path / "smol-4001.log").write_bytes(b"".join(b"line %d\n" % i for i in range(1, 11)))
    (tmp_path / "secret.key").write_text("no")
    os.symlink(tmp_path / "secret.key", tmp_path / "link-4002.log")
    logs = ChildLogs(tmp_path, max_age_s=DAY, max_bytes=1 << 20)
    for name in ("../smol-4001.log", "secret.key", "link-4002.log", "smol-4001.log/x", "nope.log"):
        assert logs.read(name, None, 5) is None, name
    tail = logs.read("smol-4001.log", None, 3)
    assert tail is not None and tail.text == b"line 8\nline 9\nline 10\n"
    assert tail.end == tail.size == len(b"".join(b"line %d\n" % i for i in range(1, 11)))
    with (tmp_path / "smol-4001.log").open("ab") as file:
        file.write(b"line 11\n")
    follow = logs.read("smol-4001.log", tail.end, 3)
    assert follow is not None and follow.text == b"line 11\n" and follow.start == tail.end
    whole = logs.read("smol-4001.log", None, 1000)
    assert whole is not None and whole.start == 0 and whole.text.count(b"\n") == 11
    past = logs.read("smol-4001.log", 10**9, 3)  # a follower of a file that was rotated
    assert past is not None and past.text == b"" and past.end == past.size

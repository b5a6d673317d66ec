"""A box key rotated while the box runs (`fitbox keys rotate-box` revokes the old one at
once) reaches the central promptly: the box's joining task watches its key file after the
central took it and registers again with the new key, so the central calls the box with a
key that works within seconds, not at the box's next start. In process: the box's own
joining task against a stdlib server that records the registrations."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from fitbox.server.manage import joining
from fitbox.store.box_key import write_secret

from .support.local_http import JsonHandler, serve_handler


class RecordingCentral(JsonHandler):
    taken: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        RecordingCentral.taken.append(self.read_json())
        self.send_json({"registered": True, "moved": False})


@pytest.fixture
def central() -> Iterator[str]:
    RecordingCentral.taken.clear()
    with serve_handler(RecordingCentral) as url:
        yield url


async def _registrations(central: str, key_file: Path) -> list[str]:
    first = "fb_000000000001_" + "a" * 43
    write_secret(key_file, first)
    reg = joining.Registration(
        central, "", "box-1", "gpu-1", "http://127.0.0.1:8484", first, None, key_file
    )
    task = asyncio.get_running_loop().create_task(joining.keep_registering(reg))
    try:
        for _ in range(200):
            await asyncio.sleep(0.02)
            if RecordingCentral.taken:
                break
        write_secret(key_file, "fb_000000000002_" + "b" * 43)  # rotated
        for _ in range(200):
            await asyncio.sleep(0.02)
            if len(RecordingCentral.taken) >= 2:
                break
        await asyncio.sleep(0.2)  # and not again while the key stays as it is
    finally:
        task.cancel()
    return [r["admin_key"] for r in RecordingCentral.taken]


def test_a_rotated_box_key_is_registered_with_the_central_again(
    central: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(joining, "KEY_WATCH_S", 0.02)
    keys = asyncio.run(_registrations(central, tmp_path / "box.key"))
    assert keys == ["fb_000000000001_" + "a" * 43, "fb_000000000002_" + "b" * 43]

"""The path of one warm streamed chat: the files in ``server/`` it crosses, and the calls
``server/`` makes into ``box/`` before its first byte.

    PYTHONPATH=src python bench/call_path.py [--model FILE.gguf] [--list]

The app runs in this process (``create_app``, its lifespan as ``fitbox serve`` runs it),
with a real llama-server child (the engine venv's) on the repo's SmolLM2 (under
``$FITBOX_TEST_CACHE/models``, else ``.cache/models``). One streamed 1-token chat warms it
(the model loads); the next is traced with ``sys.setprofile`` from the moment the ASGI app
is called until its last body message:

- files crossed: every file under ``src/fitbox/server/`` one of whose Python functions ran
  (middleware, route, parsing, forwarding, stream reshaping, framing) in a task (a loop
  callback, such as the store's change signal waking the dashboard, is no call's path);
- calls into box before the first byte: every function under ``src/fitbox/box/`` entered
  straight from a frame in ``server/`` (a property counts: it is a call) before the
  ``http.response.start`` message (the status line) reaches the server. A coroutine
  counts once, however often it is resumed; box's own calls inside it do not count.

It also prints how many Python functions the request's own task called (any package; a
coroutine once, however often it resumes): a count of the work, steadier than a clock on a
shared box.
``--list`` prints each file and each call. Run it against another tree with its own
``PYTHONPATH`` to compare two commits (the import points are ``fitbox.config.load`` and
``fitbox.server.app.create_app`` only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = "SmolLM2-135M-Instruct.Q4_1"
Message = dict[str, Any]


@dataclass
class Trace:
    """What one traced request ran: server files, and box calls before the first byte."""

    server: str  # the server package's folder, with its trailing separator
    box: str
    files: set[str] = field(default_factory=set)
    box_files: set[str] = field(default_factory=set)  # (with --list: what the call ran below)
    entered: int = 0  # functions the request's own task called (any package): its work
    task: asyncio.Task[Any] | None = None  # the request's task (the app's)
    frames: set[FrameType] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    seen: set[FrameType] = field(default_factory=set)  # a resumed coroutine counts once
    started: bool = False  # the status line has gone

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        task = asyncio.current_task()
        if event != "call" or task is None:
            return  # (a loop callback, such as the store's change signal, is no call's)
        if task is self.task and frame not in self.frames:  # a first entry, not a resumption
            self.frames.add(frame)
            self.entered += 1
        where = frame.f_code.co_filename
        if where.startswith(self.server):
            self.files.add(where.removeprefix(self.server))
        elif where.startswith(self.box):
            self.box_files.add(where.removeprefix(self.box))
        if self.started or not where.startswith(self.box) or frame in self.seen:
            return
        self.seen.add(frame)
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename.startswith(self.server):
            self.calls.append(
                f"server/{caller.f_code.co_filename.removeprefix(self.server)}:"
                f"{caller.f_code.co_name} -> box/{where.removeprefix(self.box)}:"
                f"{frame.f_code.co_name}"
            )


def scope_for(body: bytes) -> Message:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }


async def chat(
    app: Callable[[Message, Any, Any], Awaitable[None]], model: str, trace: Trace | None
) -> tuple[int, bytes]:
    """One streamed 1-token chat through ``app``; traced when ``trace`` is given."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 1,
            "stream": True,
        }
    ).encode()
    given = False
    status, content = 0, bytearray()

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            if trace is not None:
                trace.started = True
        elif message["type"] == "http.response.body":
            content.extend(message.get("body", b""))

    if trace is not None:
        trace.task = asyncio.current_task()
        sys.setprofile(trace.profile)
    try:
        await app(scope_for(body), receive, send)
    finally:
        sys.setprofile(None)
    return status, bytes(content)


async def traced(model_file: Path, trace: Trace) -> Trace:
    from fitbox import config as settings
    from fitbox.server.app import create_app

    with tempfile.TemporaryDirectory() as home:
        config = settings.load(
            {"home": home, "models": str(model_file.parent)},
            env={"FITBOX_SIMULATED_GPUS": "", "PATH": os.environ.get("PATH", "")},
        )
        app = create_app(config)
        async with app.router.lifespan_context(app):
            status, content = await chat(app, model_file.stem, None)  # the model loads
            assert status == 200 and b"[DONE]" in content, (status, content[-400:])
            status, content = await chat(app, model_file.stem, trace)
            assert status == 200 and b"[DONE]" in content, (status, content[-400:])
    return trace


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cache = Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache"))
    parser.add_argument("--model", type=Path, default=cache / "models" / f"{MODEL}.gguf")
    parser.add_argument("--list", action="store_true", help="print each file and each call")
    args = parser.parse_args()
    import fitbox

    package = Path(fitbox.__file__).resolve().parent  # the tree PYTHONPATH points at
    trace = Trace(f"{package / 'server'}{os.sep}", f"{package / 'box'}{os.sep}")
    asyncio.run(traced(args.model, trace))
    if args.list:
        for name in sorted(trace.files):
            print(f"  server/{name}")
    print(f"files crossed in server/: {len(trace.files)}")
    if args.list:
        print(f"  (and box/: {', '.join(sorted(trace.box_files))})")
        for call in trace.calls:
            print(f"  {call}")
    print(f"calls from server/ into box/ before the first byte: {len(trace.calls)}")
    print(f"functions the request's task called (any package): {trace.entered}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

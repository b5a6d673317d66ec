"""Real headless Chromium, driven over Chrome's DevTools protocol on a pipe
(``--remote-debugging-pipe``: commands on its fd 3, replies on its fd 4, each message JSON
ending in a NUL byte). No websocket, no node: the standard library speaks it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .tools import required_tool

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
)


class DevToolsError(RuntimeError):
    pass


class Browser:
    def __init__(self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int):
        self.proc, self._out, self._in = proc, to_browser, from_browser
        self._next = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._arrived = threading.Condition()
        self._buffer = b""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while chunk := os.read(self._in, 1 << 16):
            self._buffer += chunk
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._arrived:
                        self._replies[message["id"]] = message
                        self._arrived.notify_all()

    def send(
        self, method: str, session: str | None = None, timeout: float = 60, **params: Any
    ) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        with self._arrived:
            if not self._arrived.wait_for(lambda: self._next in self._replies, timeout):
                raise DevToolsError(f"no reply to {method} within {timeout:g} s")
            reply = self._replies.pop(self._next)
        if "error" in reply:
            raise DevToolsError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def open(self, url: str, javascript: bool = True) -> Page:
        """A new tab on ``url``, loaded (its load event fired)."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        page = Page(self, session)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=1280,
            height=900,
            deviceScaleFactor=1,
            mobile=False,
        )
        if not javascript:
            self.send("Emulation.setScriptExecutionDisabled", session, value=True)
        self.send("Page.enable", session)
        page.navigate(url)
        return page


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    def navigate(self, url: str) -> None:
        self.browser.send("Page.navigate", self.session, url=url)
        self.wait_for("document.readyState === 'complete'", "the page loaded")

    def reload(self) -> None:
        self.browser.send("Page.reload", self.session)
        time.sleep(0)  # the reload is queued; readyState reads 'loading' once it starts
        self.wait_for("document.readyState === 'complete'", "the page reloaded")

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (DevTools runs it even where the
        page's own scripts are disabled)."""
        found = self.browser.send(
            "Runtime.evaluate", self.session, expression=expression, returnByValue=True
        )
        if "exceptionDetails" in found:
            raise DevToolsError(f"{expression}: {found['exceptionDetails']}")
        return found["result"].get("value")

    def wait_for(self, expression: str, what: str, within: float = 30.0) -> Any:
        deadline = time.monotonic() + within
        while not (value := self.eval(expression)):
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {within:g} s: {what}")
            time.sleep(0.05)
        return value

    def screenshot(self, path: Path) -> None:
        data = self.browser.send("Page.captureScreenshot", self.session, format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[Browser]:
    binary = required_tool("chromium", "chromium")
    commands_r, commands_w = os.pipe()
    replies_r, replies_w = os.pipe()

    def wire() -> None:  # in the child: fd 3 reads commands, fd 4 writes replies
        os.dup2(commands_r, 100)  # by way of free numbers: either end may be 3 or 4 now
        os.dup2(replies_w, 101)
        os.dup2(100, 3)
        os.dup2(101, 4)

    with (profile.parent / "chromium.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                str(binary),
                *FLAGS,
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=wire,
            close_fds=False,  # the parent's own descriptors are close-on-exec (PEP 446)
        )
    os.close(commands_r)
    os.close(replies_w)
    try:
        yield Browser(proc, commands_w, replies_r)
    finally:
        os.close(commands_w)
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(replies_r)

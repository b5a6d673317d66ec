"""The task child's process: load one runner's model in the background, answer HTTP.

    <env python> -c "<boot>" <folder above task_child> --runner whisper --model PATH --port N

``/health`` answers 503 while the model loads and 200 once it is ready; ``/props`` says
what the process holds (``held_bytes``: its resident memory after the load, the figure
fitbox prices the next placement by); ``/measured/<call>`` what a finished call measured
(its audio seconds), once. A load that fails prints why and exits 1. One call runs at a
time: fitbox serves this child one slot.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import threading
import traceback
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .replies import BadRequest, Runner, Stream, Whole

KEEP_MEASURED = 64  # finished calls whose figures wait for fitbox to read them


def resident_bytes() -> int:
    """This process's resident memory now (VmRSS), 0 where /proc says nothing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Loaded:
    """The runner once loaded (``ready`` set), and the figures of its finished calls."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ready = threading.Event()
        self.runner: Runner | None = None
        self.rss_before = resident_bytes()
        self.rss_after = 0
        self.busy = threading.Lock()
        self.measured: OrderedDict[str, dict[str, float]] = OrderedDict()

    def load(self) -> None:
        module = importlib.import_module(f"task_child.{self.args.runner}")
        self.runner = module.load(self.args.model, self.args.device, self.args.threads)
        self.rss_after = resident_bytes()
        print(
            f"fitbox-task: {self.args.runner} loaded {self.args.model}: "
            f"{self.rss_after} bytes resident ({self.rss_after - self.rss_before} by the load)",
            flush=True,
        )
        self.ready.set()

    def props(self) -> dict[str, Any]:
        assert self.runner is not None
        return {
            "model_path": self.args.model,
            "alias": self.args.alias,
            "runner": self.args.runner,
            "total_slots": 1,
            "held_bytes": self.rss_after,
            "rss_bytes_before_load": self.rss_before,
            "rss_bytes_after_load": self.rss_after,
            "rss_bytes": resident_bytes(),
            **self.runner.extra_props(),
        }

    def keep(self, call: str, figures: dict[str, float]) -> None:
        self.measured[call] = dict(figures)
        while len(self.measured) > KEEP_MEASURED:
            self.measured.popitem(last=False)


def error_body(message: str, kind: str, code: str, param: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": kind, "code": code, "param": param}}
    ).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    loaded: Loaded  # set on the class by main()
    streaming = False

    def log_message(self, format: str, *args: Any) -> None:
        pass  # fitbox logs every call itself; this output is the load log

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        loaded = self.loaded
        if self.path == "/health":
            if loaded.ready.is_set():
                self._send(200, b'{"status":"ok"}')
            else:
                self._send(503, error_body("Loading model", "unavailable_error", "loading"))
        elif self.path == "/props" and loaded.ready.is_set():
            self._send(200, json.dumps(loaded.props()).encode())
        elif self.path.startswith("/measured/"):
            figures = loaded.measured.pop(self.path.removeprefix("/measured/"), None)
            self._send(200 if figures is not None else 404, json.dumps(figures).encode())
        else:
            self._send(404, error_body(f"no route {self.path}", "not_found_error", "not_found"))

    def do_POST(self) -> None:
        self.streaming = False
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            runner = self.loaded.runner
            if not self.loaded.ready.is_set() or runner is None:
                self._send(503, error_body("Loading model", "unavailable_error", "loading"))
                return
            route = runner.routes.get(self.path)
            if route is None:
                message = f"this model does not serve {self.path}"
                self._send(404, error_body(message, "invalid_request_error", "wrong_route"))
                return
            with self.loaded.busy:
                runner.measured.clear()
                self._reply(route(body))
                self.loaded.keep(str(body.get("call", "")), runner.measured)
        except BadRequest as exc:
            self._send(400, error_body(str(exc), "invalid_request_error", exc.code, exc.param))
        except (BrokenPipeError, ConnectionResetError):
            return  # fitbox closed the call (its client left): nobody reads the rest
        except Exception as exc:  # the runner failed mid-call: say so, if no reply has begun
            traceback.print_exc()
            if self.streaming:
                raise  # the stream breaks off: fitbox ends the call as failed
            message = f"the engine failed: {exc}"
            self._send(500, error_body(message, "server_error", "engine_failed"))

    def _reply(self, reply: Whole | Stream) -> None:
        if isinstance(reply, Whole):
            self.send_response(200)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.content)))
            self.end_headers()
            self.wfile.write(reply.content)
            return
        first = next(reply.chunks, b"")  # a bad input fails here, before any header is sent
        self.streaming = True
        self.send_response(200)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in _chain(first, reply.chunks):
            if chunk:
                self._write_chunk(chunk)
        self._write_chunk(b"")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _chain(first: bytes, rest: Any) -> Any:
    yield first
    yield from rest


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="task_child")
    parser.add_argument("--runner", required=True)  # a module of this package
    parser.add_argument("--model", required=True)
    parser.add_argument("--alias", default="model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = arguments(argv)
    loaded = Loaded(args)
    Handler.loaded = loaded
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True

    def load() -> None:
        try:
            loaded.load()
        except BaseException:
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)  # the load failed: fitbox sees the exit and reads why above

    threading.Thread(target=load, name="load", daemon=True).start()
    print(f"fitbox-task: listening on {args.host}:{args.port}, loading {args.model}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])

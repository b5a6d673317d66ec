"""The child's process: load one model folder in the background, answer HTTP meanwhile.

    <engine python> -c "<boot>" <folder above tf_child> --model DIR --port N [...]

``/health`` answers 503 while the model loads and 200 once it is ready; a load that fails
prints why and exits 1 (fitbox reads the end of this output). One call runs at a time: the
box serves this child one slot, so a second call waits at fitbox's door, not here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import replies
from .chat import BadRequest, Chat, Timings
from .counts import cache_bytes, counted_weights, resident_bytes
from .embed import Embedder, embedding_request
from .placing import load_options
from .vision import VisionChat

COUNT = "/v1/chat/completions/count"  # a chat body's prompt tokens (tf.py count_prompt)


class Loaded:
    """The model once loaded (``ready`` set), or why it failed."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ready = threading.Event()
        self.chat: Chat | None = None
        self.embedder: Embedder | None = None
        self.weights: dict[str, Any] = {}
        self.rss_after_load = 0
        self.busy = threading.Lock()
        self.calls = 0  # chat calls begun since the child started (/props: a report)

    def load(self) -> None:
        import torch

        args = self.args
        if args.threads:
            torch.set_num_threads(args.threads)
        folder = Path(args.model)
        device = "cuda" if args.device == "cuda" and torch.cuda.is_available() else "cpu"
        placement = load_options(args, device)
        if args.embedding:
            self.embedder = Embedder(folder, device)
            if self.embedder.sentence is None:
                from transformers import AutoModel, AutoTokenizer

                model = AutoModel.from_pretrained(folder, dtype="auto", **placement)
                model = model if placement else model.to(device)
                self.embedder = Embedder(
                    folder, device, model.eval(), AutoTokenizer.from_pretrained(folder)
                )
            model = self.embedder.model
        else:
            from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

            auto = AutoModelForImageTextToText if args.vision else AutoModelForCausalLM
            model = auto.from_pretrained(folder, dtype="auto", **placement)
            model = model if placement else model.to(device)
            if args.adapter:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, args.adapter)
            self.chat = self._chat(model.eval(), folder)
        self.weights = counted_weights(model)
        self.rss_after_load = resident_bytes()
        print(
            f"fitbox-tf: loaded {folder} on {device}: counted weights {json.dumps(self.weights)}",
            flush=True,
        )
        self.ready.set()

    def _chat(self, model: Any, folder: Path) -> Chat:
        """A vision-language folder reads images through its processor; others, text."""
        if self.args.vision:
            from transformers import AutoProcessor

            processor = AutoProcessor.from_pretrained(folder)
            return VisionChat(model, processor, self.args.window, folder)
        from transformers import AutoTokenizer

        return Chat(model, AutoTokenizer.from_pretrained(folder), self.args.window, folder)

    def props(self) -> dict[str, Any]:
        chat = self.chat
        return {
            "model_path": self.args.model,
            "alias": self.args.alias,
            "total_slots": 1,
            "n_ctx": self.args.window,
            "default_generation_settings": {"n_ctx": self.args.window},
            "weights": self.weights,
            "kv_bytes_now": cache_bytes(chat.cache) if chat is not None else 0,
            # what the child did, as it counts it: a call stopped by a cancel shows here
            "tokens_made": chat.made_total if chat is not None else 0,
            "generating": chat.generating if chat is not None else False,
            "calls": self.calls,
            "rss_bytes_after_load": self.rss_after_load,
            "rss_bytes": resident_bytes(),
        }


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

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            if self.loaded.ready.is_set():
                self._send(200, b'{"status":"ok"}')
            else:
                self._send(503, error_body("Loading model", "unavailable_error", "loading"))
        elif self.path == "/props" and self.loaded.ready.is_set():
            self._send(200, json.dumps(self.loaded.props()).encode())
        else:
            self._send(404, error_body(f"no route {self.path}", "not_found_error", "not_found"))

    def do_POST(self) -> None:
        self.streaming = False  # once a stream's headers are out, no other reply can follow
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            if not self.loaded.ready.is_set():
                self._send(503, error_body("Loading model", "unavailable_error", "loading"))
                return
            if self.path == COUNT and self.loaded.chat is not None:
                self._count(body)  # never behind the call running: fitbox asks to place one
                return
            with self.loaded.busy:
                if self.path == "/v1/chat/completions" and self.loaded.chat is not None:
                    self._chat(body)
                elif self.path == "/v1/embeddings" and self.loaded.embedder is not None:
                    self._embeddings(body)
                else:
                    self._send(
                        404,
                        error_body(
                            f"this model does not serve {self.path}",
                            "invalid_request_error",
                            "wrong_route",
                        ),
                    )
        except BadRequest as exc:
            self._send(400, error_body(str(exc), "invalid_request_error", "bad_request", exc.param))
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._send(400, error_body("the body is not JSON", "invalid_request_error", "bad_json"))
        except Exception as exc:  # torch failed mid-call: say so, if no reply has begun
            traceback.print_exc()
            if self.streaming:
                raise  # the stream breaks off: fitbox ends it with an error event
            self._send(
                500, error_body(f"the engine failed: {exc}", "server_error", "engine_failed")
            )

    def _chat(self, body: dict[str, Any]) -> None:
        chat = self.loaded.chat
        assert chat is not None
        request = chat.request(body)
        timings = Timings()
        base = {
            "id": f"chatcmpl-tf{time.time_ns()}",
            "created": int(time.time()),
            "model": self.loaded.args.alias,
        }
        self.loaded.calls += 1
        with self._watching() as cancelled:
            pieces = chat.run(request, timings, cancelled)
            try:
                if not request.stream:
                    reply = replies.whole(request, pieces, base, timings)
                    if not cancelled.is_set():
                        self._send(200, json.dumps(reply).encode())
                    return
                first = next(pieces)  # a bad prompt fails here, before any header is sent
                self._stream(request, _chain(first, pieces), base, timings, cancelled)
            finally:
                pieces.close()

    def _count(self, body: dict[str, Any]) -> None:
        chat = self.loaded.chat
        assert chat is not None
        try:
            tokens = chat.count(body)
        except NotImplementedError:
            self._send(501, error_body("not counted here", "not_implemented_error", "no_count"))
            return
        self._send(200, json.dumps({"input_tokens": tokens}).encode())

    def _stream(
        self,
        request: Any,
        pieces: Any,
        base: dict[str, Any],
        timings: Timings,
        cancelled: threading.Event,
    ) -> None:
        self.streaming = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        role = {"role": "assistant", "content": ""}
        try:
            for i in range(request.n):
                choice = {"index": i, "delta": role, "finish_reason": None}
                self._event({**base, "object": "chat.completion.chunk", "choices": [choice]})
            for event in replies.events(request, pieces, base, timings):
                self._event(event)
            self._write_chunk(b"data: [DONE]\n\n")
            self._write_chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            cancelled.set()  # the client went away: stop making tokens for nobody

    @contextlib.contextmanager
    def _watching(self) -> Iterator[threading.Event]:
        """An event set as soon as the caller closes its connection while the call runs
        (a whole reply's caller sends nothing more, so a readable socket that reads empty
        is a close): the decode loop stops at its next token, and the child is free."""
        cancelled = threading.Event()
        wake_r, wake_w = os.pipe()
        sock = self.connection

        def watch() -> None:
            ready, _, _ = select.select([sock, wake_r], [], [])
            if sock in ready:
                try:
                    closed = sock.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    closed = True
                if closed:
                    cancelled.set()

        watcher = threading.Thread(target=watch, name="disconnect-watch", daemon=True)
        watcher.start()
        try:
            yield cancelled
        finally:
            os.write(wake_w, b"x")
            watcher.join()
            os.close(wake_r)
            os.close(wake_w)

    def _event(self, event: dict[str, Any]) -> None:
        self._write_chunk(b"data: " + json.dumps(event).encode() + b"\n\n")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _embeddings(self, body: dict[str, Any]) -> None:
        embedder = self.loaded.embedder
        assert embedder is not None
        asked = embedding_request(body)
        vectors, tokens = embedder.embed(asked.texts)
        data = [
            {"object": "embedding", "index": i, "embedding": embedder.shaped(v, asked)}
            for i, v in enumerate(vectors)
        ]
        reply = {
            "object": "list",
            "model": self.loaded.args.alias,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        self._send(200, json.dumps(reply).encode())


def _chain(first: Any, rest: Any) -> Any:
    yield first
    yield from rest


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tf_child")
    parser.add_argument("--model", required=True)
    parser.add_argument("--alias", default="model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--embedding", action="store_true")
    parser.add_argument("--adapter", default="")
    parser.add_argument("--load-in-4bit", action="store_true")  # the 4bit rung (placing.py)
    parser.add_argument("--experts-in-ram", action="store_true")  # the moe-split rung
    parser.add_argument("--vision", action="store_true")  # image parts, through the processor
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
            import os

            os._exit(1)  # the load failed: fitbox sees the exit and reads why above

    threading.Thread(target=load, name="load", daemon=True).start()
    print(f"fitbox-tf: listening on {args.host}:{args.port}, loading {args.model}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])

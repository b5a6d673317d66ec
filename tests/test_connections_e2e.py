"""What a connection may cost a real `fitbox serve` (server/door/connections.py): a head over
its limits answered 431 before it is read whole, slow heads and bodies 408, idle sockets
closed after a deadline, the open-file limit raised at start and accept failures logged
once, and a transfer reader that stops reading cut off with its slot freed. The deadlines
are set short here (2 s), so each wait below is for an event with a generous bound."""

from __future__ import annotations

import json
import resource
import select
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .support.holds import until
from .support.processes import FitboxProcess, running_fitbox

SHORT = {
    "FITBOX_REQUEST_HEAD_TIMEOUT": "2",
    "FITBOX_REQUEST_BODY_TIMEOUT": "2",
    "FITBOX_SEND_STALL_TIMEOUT": "2",
    "FITBOX_TRANSFER_MAX": "1",
}
IDLE = 1100  # idle connections: more than a 1,024 open-file limit has descriptors
BOUND_S = 300.0  # a failure bound on each wait, never a timing the test relies on


def _hard_nofile() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


@pytest.fixture(scope="module", autouse=True)
def room_for_sockets() -> Iterator[None]:
    """The test's own sockets: IDLE of them at once, beyond a 1,024 soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * IDLE + 200:
        pytest.skip(f"the hard open-file limit ({hard}) is below what the test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2 * IDLE + 200), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Iterator[FitboxProcess]:
    """A box started as a service usually is: its soft open-file limit 1,024."""
    models = tmp_path_factory.mktemp("models")
    shutil.copyfile(smollm2, models / smollm2.name)
    launcher = ("prlimit", f"--nofile=1024:{_hard_nofile()}", "--")
    home = tmp_path_factory.mktemp("home")
    with running_fitbox(home, [models], env=SHORT, wrap=launcher) as box:
        yield box


def connect(box: FitboxProcess) -> socket.socket:
    host, port = box.url.rsplit("/", 1)[1].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=BOUND_S)


def whole_reply(sock: socket.socket) -> bytes:
    """Every byte the box sends until it closes the connection."""
    got = b""
    while True:
        try:
            block = sock.recv(1 << 16)
        except ConnectionResetError:
            return got
        if not block:
            return got
        got += block


def refusal(reply: bytes, status: int, code: str) -> dict[str, object]:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), reply[:300]
    assert b"connection: close" in head.lower()
    error: dict[str, object] = json.loads(body)["error"]
    assert error["code"] == code and error["message"], error
    assert set(error) >= {"message", "type", "code", "param"}
    return error


def test_a_64_mib_header_is_answered_431_before_it_is_read(box: FitboxProcess) -> None:
    total, block = 64 << 20, b"a" * (64 << 10)
    with connect(box) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        sent = 0
        while sent < total:
            readable, writable, _ = select.select([sock], [sock], [], BOUND_S)
            assert readable or writable, "the box neither read nor answered"
            if readable:
                break  # the reply came while the header was still being sent
            sent += sock.send(block)
        assert sent < total, "the box read the whole 64 MiB header without answering"
        error = refusal(whole_reply(sock), 431, "headers_too_large")
        assert "request_head_max" in str(error["message"])
    assert httpx.get(f"{box.url}/health", timeout=BOUND_S).status_code == 200


def test_too_many_headers_are_answered_431(box: FitboxProcess) -> None:
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(101))
    with connect(box) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + many + b"\r\n")
        error = refusal(whole_reply(sock), 431, "headers_too_large")
        assert "request_headers_max" in str(error["message"])


def test_a_head_that_never_ends_is_answered_408(box: FitboxProcess) -> None:
    with connect(box) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and nothing more
        error = refusal(whole_reply(sock), 408, "request_timeout")
        assert "request_head_timeout" in str(error["message"])


def test_a_body_that_never_arrives_is_answered_408(box: FitboxProcess) -> None:
    with connect(box) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model": '
        )
        error = refusal(whole_reply(sock), 408, "request_timeout")
        assert "request_body_timeout" in str(error["message"])


def test_idle_connections_are_closed_and_the_box_stays_up(box: FitboxProcess) -> None:
    """1,100 connections that never send a byte, against a box started with a soft limit
    of 1,024 open files: it raised the limit, closes each after the head deadline, answers
    /health afterwards and logs no flood."""
    limits = Path(f"/proc/{box.proc.pid}/limits").read_text()
    (line,) = [x for x in limits.splitlines() if x.startswith("Max open files")]
    assert line.split()[3] == line.split()[4], line  # soft raised to hard
    lines_before = len(box.log().splitlines())
    idle = [connect(box) for _ in range(IDLE)]
    try:
        open_ones = set(idle)
        poller = select.epoll()
        for sock in idle:
            poller.register(sock.fileno(), select.EPOLLIN)
        by_fd = {sock.fileno(): sock for sock in idle}
        while open_ones:
            events = poller.poll(BOUND_S)
            assert events, f"{len(open_ones)} idle connections still open"
            for fd, _ in events:
                sock = by_fd[fd]
                assert whole_reply(sock) == b""  # closed without a word
                poller.unregister(fd)
                open_ones.discard(sock)
        poller.close()
    finally:
        for sock in idle:
            sock.close()
    assert httpx.get(f"{box.url}/health", timeout=BOUND_S).status_code == 200
    logged = box.log().splitlines()[lines_before:]
    assert len(logged) < 20, "\n".join(logged[:40])


def test_a_transfer_reader_that_stops_reading_is_cut_off(box: FitboxProcess, smollm2: Path) -> None:
    """The box's one transfer slot (FITBOX_TRANSFER_MAX=1) is freed when its reader stops."""
    name = smollm2.name
    url = f"{box.url}/v1/transfer/{name.removesuffix('.gguf')}/file"
    host, port = box.url.rsplit("/", 1)[1].rsplit(":", 1)
    with socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
        stalled.settimeout(BOUND_S)
        stalled.connect((host, int(port)))
        path = f"/v1/transfer/{name.removesuffix('.gguf')}/file?path={name}"
        stalled.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert stalled.recv(12) == b"HTTP/1.1 200"  # sending; from here on nothing is read

        def slot_free() -> bool:
            ranged = httpx.get(url, params={"path": name}, headers={"Range": "bytes=0-0"})
            assert ranged.status_code in (206, 429), ranged.text
            return ranged.status_code == 206

        until(slot_free, "the stalled reader's transfer slot freed", within=BOUND_S)
        received = len(whole_reply(stalled))
    assert received < smollm2.stat().st_size, "the stalled reader was never cut off"


def test_accept_failures_are_logged_once_not_per_attempt(
    tmp_path: Path,
) -> None:
    """A box that cannot raise its 1,024 open files (hard limit 1,024) and is told to take
    more connections than that runs out of descriptors: asyncio then fails each accept
    again and again; the log says so once, and the box answers again once the idle ones
    are closed."""
    launcher = ("prlimit", "--nofile=1024:1024", "--")
    env = {**SHORT, "FITBOX_CONNECTIONS_MAX": "5000"}
    (tmp_path / "models").mkdir()
    with running_fitbox(tmp_path / "home", [tmp_path / "models"], env=env, wrap=launcher) as box:
        idle = [connect(box) for _ in range(IDLE)]  # the kernel queues what is not accepted
        try:
            until(lambda: "cannot accept connections" in box.log(), "an accept failure")

            def answers() -> bool:
                try:
                    return httpx.get(f"{box.url}/health", timeout=5).status_code == 200
                except httpx.TransportError:
                    return False

            until(answers, "/health once the idle connections are closed", within=BOUND_S)
        finally:
            for sock in idle:
                sock.close()
        log = box.log()
    assert log.count("cannot accept connections") <= 3, log[-3000:]
    assert len(log.splitlines()) < 60, "\n".join(log.splitlines()[:80])


def test_connections_over_the_cap_are_answered_503(tmp_path: Path) -> None:
    """Under a hard limit of 1,024 open files the box takes (1,024 - 128) / 2 connections;
    one more is told why, and descriptors stay free for the box's own files."""
    launcher = ("prlimit", "--nofile=1024:1024", "--")
    env = {"FITBOX_REQUEST_HEAD_TIMEOUT": "600"}  # the held ones stay until the test lets go
    (tmp_path / "models").mkdir()
    with running_fitbox(tmp_path / "home", [tmp_path / "models"], env=env, wrap=launcher) as box:
        held = [connect(box) for _ in range(448)]
        try:
            until(lambda: _unaccepted(box) == 0, "the box accepting the 448 it holds")
            with connect(box) as over:
                error = refusal(whole_reply(over), 503, "too_many_connections")
                assert "connections_max" in str(error["message"])
        finally:
            for sock in held:
                sock.close()
        until(lambda: httpx.get(f"{box.url}/health", timeout=5).status_code == 200, "/health")


def _unaccepted(box: FitboxProcess) -> int:
    """Connections waiting in the box's listen queue (/proc/net/tcp: a listener's rx_queue)."""
    port = int(box.url.rsplit(":", 1)[1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
            return int(queues.split(":")[1], 16)
    raise AssertionError(f"no listener on port {port}")

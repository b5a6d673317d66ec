"""What every package built here carries besides its payload, and the build itself: the
control file, md5sums, the Debian changelog and DEP-5 copyright under /usr/share/doc, the
lintian overrides, modes a Debian package has, and dpkg-deb."""

from __future__ import annotations

import email.utils
import gzip
import hashlib
import os
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAINTAINER = "fitbox packagers <packaging@fitbox.dev>"
HOMEPAGE = "https://github.com/fitbox/fitbox"


def arch() -> str:
    return subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()


def build_date() -> str:
    """RFC 2822, from SOURCE_DATE_EPOCH when set (a reproducible build), else now."""
    epoch = float(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    return email.utils.formatdate(epoch)


def gzip_to(path: Path, text: str) -> None:
    """gzip -9n: no name and no time inside (lintian: package-contains-timestamped-gzip)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as out:
        out.write(text.encode())


def changelog_entry(package: str, version: str, changes: list[str]) -> str:
    items = "\n".join(f"  * {change}" for change in changes)
    return (
        f"{package} ({version}) unstable; urgency=medium\n\n{items}\n\n"
        f" -- {MAINTAINER}  {build_date()}\n"
    )


def write_docs(stage: Path, package: str, changelog: str, copyright_text: str) -> None:
    """/usr/share/doc/PACKAGE: copyright, and the changelog as changelog.Debian.gz (a
    package whose version has a Debian revision) or changelog.gz (a native one)."""
    doc = stage / "usr" / "share" / "doc" / package
    doc.mkdir(parents=True, exist_ok=True)
    (doc / "copyright").write_text(copyright_text)
    version = changelog.split("(", 1)[1].split(")", 1)[0]
    gzip_to(doc / ("changelog.Debian.gz" if "-" in version else "changelog.gz"), changelog)


def write_overrides(stage: Path, package: str) -> None:
    """packaging/debian/PACKAGE.lintian-overrides, where lintian reads it; each override
    there carries the comment that justifies it."""
    source = HERE / f"{package}.lintian-overrides"
    if source.is_file():
        target = stage / "usr" / "share" / "lintian" / "overrides" / package
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text())


def normalise_modes(stage: Path) -> None:
    """Directories 0755, files 0644, executables 0755 (a scratch dir is 0700, pip's files
    follow the umask): the modes lintian expects of a package."""
    for path in (stage, *stage.rglob("*")):
        if path.is_symlink():
            continue
        if path.is_dir():
            path.chmod(0o755)
        else:
            path.chmod(0o755 if path.stat().st_mode & 0o111 else 0o644)


def installed_size_kib(stage: Path) -> int:
    files = [p for p in stage.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(p.stat().st_size for p in files) // 1024 + 1


def write_md5sums(stage: Path) -> None:
    lines = []
    for path in sorted(stage.rglob("*")):
        rel = path.relative_to(stage)
        if rel.parts[0] == "DEBIAN" or path.is_symlink() or not path.is_file():
            continue
        lines.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {rel}")  # noqa: S324
    (stage / "DEBIAN" / "md5sums").write_text("\n".join(lines) + "\n")


def write_control(stage: Path, fields: dict[str, str], description: str) -> None:
    control = stage / "DEBIAN"
    control.mkdir(exist_ok=True)
    lines = [f"{name}: {value}" for name, value in fields.items()]
    (control / "control").write_text("\n".join(lines) + "\n" + description.rstrip("\n") + "\n")


def dpkg_deb(stage: Path, out: Path, name: str, compression: str = "xz") -> Path:
    """Modes fixed, md5sums written, then ``dpkg-deb --build`` as root:root; ``gzip`` for a
    payload of wheels (already compressed: xz takes a minute to save 0.5 %)."""
    normalise_modes(stage)
    write_md5sums(stage)
    out.mkdir(parents=True, exist_ok=True)
    deb = out / name
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", f"-Z{compression}", "--build", str(stage), str(deb)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return deb

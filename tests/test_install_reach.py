"""`fitbox install --system` refuses an interpreter the service's user cannot reach
(installer/reach.py): under /tmp or /var/tmp (the unit's private /tmp hides it), or behind
a directory that user may not pass. tests/test_deb_e2e.py runs the same refusal without
--dry-run in clean Debian trees, and checks nothing was written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import fitbox
from fitbox.installer.reach import Account, unreachable

from .support.paths import REPO

PACKAGE = Path(fitbox.__file__).parent
NEW_USER = Account("fitbox", None, frozenset())  # not made yet: only what anyone may do


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A scratch folder outside /tmp (which the check refuses first): /dev/shm."""
    where = Path(tempfile.mkdtemp(dir="/dev/shm"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where)


def test_an_interpreter_under_tmp_is_refused_naming_why() -> None:
    why = unreachable(Path("/tmp/v/bin/python"), PACKAGE, NEW_USER)
    assert why is not None
    assert why.startswith("/tmp/v/bin/python is under /tmp") and "PrivateTmp=yes" in why
    assert "python3 -m venv /opt/fitbox/venv" in why  # what to do instead
    via_var = unreachable(Path("/var/tmp/v/bin/python"), PACKAGE, NEW_USER)
    assert via_var is not None and "under /var/tmp" in via_var


def test_a_folder_it_may_not_pass_is_named_with_its_mode(outside_tmp: Path) -> None:
    private = outside_tmp / "home"
    python = private / "v" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    python.chmod(0o755)
    private.chmod(0o700)  # as /root
    why = unreachable(python, PACKAGE, NEW_USER)
    assert why is not None
    assert why.startswith(f"the fitbox user may not pass {private} (mode drwx------, owner ")
    assert f"cannot reach {python}" in why
    root = Account("root", 0, frozenset({0}))
    assert unreachable(python, PACKAGE, root) is None


def test_a_group_the_user_is_in_lets_it_pass(outside_tmp: Path) -> None:
    shared = outside_tmp / "shared"
    python = shared / "python"
    shared.mkdir()
    python.write_text("")
    python.chmod(0o755)
    os.chown(shared, 0, 4242)
    shared.chmod(0o750)
    member = Account("svc", 4243, frozenset({4242}))
    assert unreachable(python, PACKAGE, member) is None
    stranger = Account("svc", 4243, frozenset({4243}))
    assert unreachable(python, PACKAGE, stranger) is not None
    python.chmod(0o644)  # passable, but not runnable
    why = unreachable(python, PACKAGE, member)
    assert why is not None and f"may not run {python}" in why


def test_a_link_is_followed_to_where_it_points(outside_tmp: Path) -> None:
    """A venv's python is a link to the interpreter it was made from: that one counts too
    (here /root/.pyenv's, were the tests run from such a venv)."""
    private = outside_tmp / "private"
    (private / "bin").mkdir(parents=True)
    (private / "bin" / "python3").write_text("")
    (private / "bin" / "python3").chmod(0o755)
    private.chmod(0o700)
    link = outside_tmp / "venv-python"
    link.symlink_to(private / "bin" / "python3")
    why = unreachable(link, PACKAGE, NEW_USER)
    assert why is not None and f"may not pass {private}" in why


@pytest.mark.skipif(os.geteuid() != 0, reason="install --system is root's")
def test_install_system_from_a_venv_under_tmp_refuses_before_any_step(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = sysconfig.get_paths()["purelib"]  # this venv's dependencies, fitbox from src
    refused = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "fitbox", "install", "--system", "--port", "9",
         "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{site}"},
        timeout=120,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"fitbox install: {venv}/bin/python is under /tmp" in refused.stderr
    assert refused.stdout == ""  # not even a "would" step: refused before the plan

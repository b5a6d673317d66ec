"""fitbox scout on a tree the test builds: a fake Ollama store whose real manifests point at
a real GGUF blob, a Hugging Face cache snapshot, LM Studio's folder, a folder nested past
the depth limit, a file that is named .gguf but is not one, a running llama-server started
here on a file outside every store, and a path only fitbox's store remembers. The limits
are checked by counts (directories listed), never by time, on a 100,000-directory tree."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fitbox import config
from fitbox.box.residents import Registry
from fitbox.box.sensors import sense
from fitbox.models.scout import HISTORICAL, LIVE, Finding, Limits, scout
from fitbox.models.scout.mounts import automounts, drives, read_mounts
from fitbox.models.scout.processes import model_args
from fitbox.probe.gpus import GpuProbe, GpuReading
from fitbox.store.db import Store
from fitbox.store.past_paths import past_paths

from .support.ggufs import write_tiny_llama
from .support.holds import until
from .support.processes import running_fitbox
from .support.small_drive import SmallDrive

BLOB = "sha256-" + "ab" * 32


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    top = tmp_path_factory.mktemp("tree")
    ollama = top / "ollama"
    (ollama / "blobs").mkdir(parents=True)
    write_tiny_llama(ollama / "blobs" / BLOB)
    (ollama / "blobs" / ("sha256-" + "cd" * 32)).write_text("{{ .Prompt }}")
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "layers": [
                    {
                        "mediaType": "application/vnd.ollama.image.model",
                        "digest": BLOB.replace("-", ":"),
                        "size": (ollama / "blobs" / BLOB).stat().st_size,
                    },
                    {
                        "mediaType": "application/vnd.ollama.image.template",
                        "digest": "sha256:" + "cd" * 32,
                        "size": 13,
                    },
                ],
            }
        )
    )
    repo = top / "hf" / "hub" / "models--org--tiny-gguf"
    (repo / "blobs").mkdir(parents=True)
    write_tiny_llama(repo / "blobs" / ("ef" * 32))
    (repo / "snapshots" / "rev1").mkdir(parents=True)
    (repo / "snapshots" / "rev1" / "tiny-hf.gguf").symlink_to("../../blobs/" + "ef" * 32)
    lmstudio = top / "home" / ".lmstudio" / "models" / "pub" / "repo"
    lmstudio.mkdir(parents=True)
    write_tiny_llama(lmstudio / "lm.gguf")
    root = top / "root"
    deep = root.joinpath(*"abcdefgh")
    deep.mkdir(parents=True)
    write_tiny_llama(deep / "too-deep.gguf")  # 8 levels down
    write_tiny_llama(root / "a" / "shallow.gguf")
    (root / "a" / "fake.gguf").write_bytes(b"not a gguf at all")
    (root / "a" / ".hidden").mkdir()
    write_tiny_llama(root / "a" / ".hidden" / "hidden.gguf")
    outside = top / "outside"
    outside.mkdir()
    write_tiny_llama(outside / "served-elsewhere.gguf")
    write_tiny_llama(outside / "remembered.gguf")
    return top


def _env(tree: Path) -> dict[str, str]:
    return {"OLLAMA_MODELS": str(tree / "ollama"), "HF_HUB_CACHE": str(tree / "hf" / "hub")}


def _by_path(findings: list[Finding]) -> dict[str, Finding]:
    return {Path(f.path).name: f for f in findings}


def _under(findings: list[Finding], top: Path) -> list[Finding]:
    """The findings in the test's own tree (other engines run on this machine too)."""
    return [f for f in findings if Path(f.path).is_relative_to(top)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def engine(tree: Path, llama_server_bin: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real llama-server, started here, on a file outside every store fitbox knows."""
    argv = [
        str(llama_server_bin),
        "-m",
        str(tree / "outside" / "served-elsewhere.gguf"),
        "--port",
        str(_free_port()),
        "--host",
        "127.0.0.1",
        "-c",
        "256",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_each_place_is_found_with_what_led_to_it(
    tree: Path, engine: subprocess.Popen[bytes]
) -> None:
    past = [(tree / "outside" / "remembered.gguf", "fitbox's store: fitbox pulled it (once)")]
    report = scout(
        [tree / "root"],
        past=past,
        env=_env(tree),
        home=tree / "home",
        limits=Limits(max_depth=4),
        mountinfo=tree / "no-mountinfo",
    )
    found = _by_path(report.findings)
    ollama = found[BLOB]
    assert ollama.source == "ollama" and ollama.servable and ollama.name == "tiny-latest"
    assert "manifest registry.ollama.ai/library/tiny:latest" in ollama.led_by
    assert "sha256-" + "cd" * 32 not in found  # the template layer is no model
    hf = found["tiny-hf.gguf"]
    assert hf.source == "hf_cache" and hf.servable and "org/tiny-gguf" in hf.led_by
    assert "HF_HUB_CACHE" in hf.led_by
    assert found["lm.gguf"].source == "lmstudio" and found["lm.gguf"].servable
    assert found["shallow.gguf"].servable and found["shallow.gguf"].evidence == LIVE
    fake = found["fake.gguf"]
    assert not fake.servable and "not a readable GGUF" in fake.detail  # a name is no proof
    assert "too-deep.gguf" not in found and report.tally.beyond_depth >= 1
    assert "hidden.gguf" not in found
    running = found["served-elsewhere.gguf"]
    assert running.source == "process" and running.evidence == LIVE and running.servable
    assert f"pid {engine.pid} (llama-server)" in running.led_by
    remembered = found["remembered.gguf"]
    assert remembered.source == "store" and remembered.evidence == HISTORICAL
    assert remembered.servable


def test_pid_scouts_that_process_alone(tree: Path, engine: subprocess.Popen[bytes]) -> None:
    report = scout([tree / "root"], pid=engine.pid, env=_env(tree), home=tree / "home")
    assert [Path(f.path).name for f in report.findings] == ["served-elsewhere.gguf"]


def test_a_finding_reached_twice_is_one_finding(tree: Path) -> None:
    # the HF cache is also under the walked root: the snapshot link and its blob are one file
    report = scout(
        [tree / "hf"], env=_env(tree), home=tree / "home", mountinfo=tree / "no-mountinfo"
    )
    hf = [f for f in report.findings if f.path.endswith("tiny-hf.gguf")]
    assert len(hf) == 1 and hf[0].source == "hf_cache"


MOUNTINFO = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
23 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw
40 22 0:35 / /mnt/nas rw,relatime shared:20 - autofs systemd-1 rw,fd=52,pgrp=1,timeout=0
41 22 259:3 / /srv/models\\040big rw,relatime shared:21 - xfs /dev/nvme1n1 rw
42 22 0:45 / /run/user/1000 rw,nosuid shared:30 - tmpfs tmpfs rw
"""


def test_mounted_drives_are_read_and_automount_points_never_entered(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    mounts = read_mounts(info)
    assert drives(mounts) == [Path("/"), Path("/srv/models big")]
    assert automounts(mounts).points == {Path("/mnt/nas")}
    assert automounts(mounts).devices == {os.makedev(0, 35)}
    # an automount point inside a walked root: listed as skipped, never entered
    (tmp_path / "root" / "nas").mkdir(parents=True)
    write_tiny_llama(tmp_path / "root" / "nas" / "would-wake.gguf")
    info.write_text(MOUNTINFO + f"50 22 0:46 / {tmp_path}/root/nas rw - autofs auto rw\n")
    report = scout([tmp_path / "root"], env={}, home=tmp_path / "home", mountinfo=info)
    assert _under(report.findings, tmp_path) == []
    assert report.tally.automounts_skipped == [str(tmp_path / "root" / "nas")]


# Lines as Linux writes them (mountinfo(5)): systemd's automount of binfmt_misc, empty and
# then with the filesystem it mounted on top; an autofs daemon's indirect map (/net); a
# direct map with a space in its point; an NFS share an automount point already mounted.
REAL_AUTOFS = """\
28 22 0:26 / /proc/sys/fs/binfmt_misc rw,relatime shared:13 - autofs systemd-1 rw,fd=29,\
pgrp=1,timeout=0,minproto=5,maxproto=5,direct,pipe_ino=15367
452 28 0:48 / /proc/sys/fs/binfmt_misc rw,nosuid,nodev,noexec,relatime shared:241 - \
binfmt_misc binfmt_misc rw
36 22 0:32 / /net rw,relatime shared:19 - autofs /etc/auto.net rw,fd=7,pgrp=1203,timeout=300,\
minproto=5,maxproto=5,indirect,pipe_ino=23921
37 22 0:33 / /srv/team\\040share rw,relatime shared:20 - autofs /etc/auto.direct rw,fd=13,\
pgrp=1203,timeout=300,minproto=5,maxproto=5,direct,pipe_ino=23925
61 37 0:52 / /srv/team\\040share rw,relatime shared:40 - nfs4 nas:/export/team rw,vers=4.2
"""


def test_real_autofs_lines_name_every_automount_point_mounted_or_not(tmp_path: Path) -> None:
    """Rule 1 on lines as the kernel writes them: each autofs entry is a point, a mounted
    one too (its NFS entry on top is no reason to enter it), and whatever lies below one."""
    info = tmp_path / "mountinfo"
    info.write_text(REAL_AUTOFS)
    assert len(REAL_AUTOFS.splitlines()) == 5
    mounts = read_mounts(info)
    found = automounts(mounts)
    assert found.points == {Path("/proc/sys/fs/binfmt_misc"), Path("/net"), Path("/srv/team share")}
    assert found.devices == {os.makedev(0, 26), os.makedev(0, 32), os.makedev(0, 33)}
    assert drives(mounts) == [Path("/srv/team share")]  # the NFS share, a real filesystem
    assert found.point_over(Path("/net/fileserver/models")) == Path("/net")
    assert found.point_over(Path("/srv/team share/../team share/m.gguf")) == Path("/srv/team share")
    assert found.point_over(Path("/srv/team")) is None
    assert found.point_over(Path("/network")) is None  # a prefix of letters is no parent


def test_an_automount_point_reached_by_another_spelling_is_skipped_by_its_device(
    tmp_path: Path, drive: SmallDrive
) -> None:
    """Rule 2: no autofs here (this kernel has none), so the table names the device of a
    real tmpfs mounted inside the walked root as an autofs one, at a path the walk never
    spells (as when a root is reached through a link). The walk stats the directory (a
    stat never triggers an automount) and does not list it: its GGUF is never found."""
    write_tiny_llama(drive.path / "would-wake.gguf")
    write_tiny_llama(tmp_path / "beside.gguf")
    dev = os.stat(drive.path).st_dev
    info = tmp_path / "mountinfo"
    info.write_text(
        MOUNTINFO + f"60 22 {os.major(dev)}:{os.minor(dev)} / /mnt/spelt\\040"
        "otherwise rw - autofs systemd-1 rw,fd=9,direct\n"
    )
    report = scout([tmp_path], env={}, home=tmp_path / "home", mountinfo=info)
    assert [Path(f.path).name for f in _under(report.findings, tmp_path)] == ["beside.gguf"]
    assert report.tally.automounts_skipped == [str(drive.path)]
    plain = scout([tmp_path], env={}, home=tmp_path / "home", mountinfo=tmp_path / "none")
    assert sorted(Path(f.path).name for f in _under(plain.findings, tmp_path)) == [
        "beside.gguf",
        "would-wake.gguf",
    ]


def test_known_places_and_remembered_paths_behind_an_automount_point_are_not_reached(
    tmp_path: Path,
) -> None:
    """HF_HOME, OLLAMA_MODELS and a path fitbox's store remembers, all under a point the
    table names: none is looked up (resolving or listing one would cross the point)."""
    share = tmp_path / "share"
    (share / "hf" / "hub").mkdir(parents=True)
    (share / "ollama" / "manifests").mkdir(parents=True)
    write_tiny_llama(share / "remembered.gguf")
    info = tmp_path / "mountinfo"
    info.write_text(f"70 22 0:77 / {share} rw - autofs systemd-1 rw,fd=9,direct\n")
    env = {"HF_HOME": str(share / "hf"), "OLLAMA_MODELS": str(share / "ollama")}
    report = scout(
        [],
        past=[(share / "remembered.gguf", "pulled once")],
        env=env,
        home=tmp_path / "home",
        mountinfo=info,
    )
    assert _under(report.findings, tmp_path) == []
    assert sorted(report.tally.automounts_skipped) == sorted(
        [str(share / "hf" / "hub"), str(share / "ollama"), str(share / "remembered.gguf")]
    )
    without = scout(
        [],
        past=[(share / "remembered.gguf", "pulled once")],
        env=env,
        home=tmp_path / "home",
        mountinfo=tmp_path / "none",
    )
    assert [Path(f.path).name for f in _under(without.findings, tmp_path)] == ["remembered.gguf"]


def test_model_paths_are_read_from_command_lines() -> None:
    assert model_args(["llama-server", "-m", "/a.gguf", "--port", "1"]) == ["/a.gguf"]
    assert model_args(["koboldcpp", "--model=/b.gguf"]) == ["/b.gguf"]
    assert model_args(["vllm", "serve", "--model", "/c"]) == ["/c"]
    assert model_args(["llama-cli", "/d.gguf"]) == ["/d.gguf"]


@pytest.fixture(scope="module")
def wide_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """100,000 directories (100 x 1,000), one GGUF-named file in the very last one: never
    reached within the limits below."""
    top = tmp_path_factory.mktemp("wide")
    for i in range(100):
        parent = top / f"d{i:03d}"
        parent.mkdir()
        for j in range(1000):
            os.mkdir(parent / f"e{j:04d}")
    (top / "d099" / "e0999" / "last.gguf").write_bytes(b"GGUF")
    return top


def test_the_limits_hold_on_a_100000_directory_tree(wide_tree: Path, tmp_path: Path) -> None:
    limits = Limits(max_depth=6, max_dirs=5_000, max_results=10)
    report = scout([wide_tree], env={}, home=tmp_path, limits=limits, mountinfo=tmp_path / "none")
    assert report.tally.dirs_visited == 5_000 and report.tally.dirs_left
    assert _under(report.findings, wide_tree) == []
    shallow = scout(
        [wide_tree],
        env={},
        home=tmp_path,
        mountinfo=tmp_path / "none",
        limits=Limits(max_depth=1, max_dirs=200_000),
    )
    assert shallow.tally.dirs_visited == 101 and shallow.tally.beyond_depth == 100_000
    # the whole walk (100,101 directories, last.gguf found) is timed by bench/transfer.py


def test_results_are_capped(tree: Path, tmp_path: Path) -> None:
    report = scout(
        [tree],
        env=_env(tree),
        home=tree / "home",
        mountinfo=tmp_path / "none",
        limits=Limits(max_results=2),
    )
    assert len(report.findings) == 2 and report.tally.results_left >= 3


def test_the_store_remembers_paths_it_launched_pulled_or_hashed(tmp_path: Path) -> None:
    store = Store(tmp_path / "fitbox.sqlite3")
    try:
        store.pulled("smollm2", "/models/a.gguf", 10, True, "ok")
        store.pulled("smollm2", "/models/failed.gguf", None, False, "error", "boom")
        store.flush()
        found = dict(store.run(past_paths))
    finally:
        store.close()
    assert list(found) == ["/models/a.gguf"] and "pulled it" in found["/models/a.gguf"]


def _fitbox(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fitbox", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_records_findings_and_attach_links_in_place(tree: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_fitbox(home, []) as box:
        done = _fitbox(home, "scout", "--root", str(tree / "root"), "--json")
        assert done.returncode == 0, done.stderr
        names = {Path(f["path"]).name for f in json.loads(done.stdout)["findings"]}
        assert {"shallow.gguf", "fake.gguf"} <= names
        listed = httpx.get(f"{box.url}/v1/telemetry/scout", timeout=30).json()["data"]
        assert {Path(r["path"]).name for r in listed} >= {"shallow.gguf", "fake.gguf"}
        assert {r["servable"] for r in listed if r["path"].endswith("fake.gguf")} == {0}
        replay = httpx.get(
            f"{box.url}/v1/telemetry", timeout=30, params={"table": "scout_findings"}
        ).json()
        assert replay["rows"] and replay["next"] > 0  # a mirror can follow it by seq
        refused = _fitbox(home, "scout", "--attach", str(tree / "root" / "a" / "fake.gguf"))
        assert refused.returncode == 1 and "not a readable GGUF" in refused.stderr
        blob = tree / "ollama" / "blobs" / BLOB
        attached = _fitbox(home, "scout", "--attach", str(blob), "--name", "tiny-latest")
        assert attached.returncode == 0, attached.stderr
        link = home / "models" / "tiny-latest.gguf"
        assert link.is_symlink() and link.resolve() == blob
        assert "tiny-latest" in box.models()  # the running box's catalog was refreshed
    with contextlib.closing(sqlite3.connect(home / "fitbox.sqlite3")) as conn:
        assert conn.execute("SELECT COUNT(*) FROM scout_findings").fetchone()[0] >= 2


class ForeignProcessOnGpu(GpuProbe):
    """NVML as a GPU box's driver answers it when a process fitbox did not start holds
    memory on gpu0 (this machine may have no GPU: the process is real, the driver is not)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def read(self) -> list[GpuReading]:
        return [GpuReading(0, "GPU-test", "test GPU", 8 << 30, 7 << 30, False)]

    def processes(self) -> dict[str, dict[int, int]]:
        return {"gpu0": {self.pid: 1 << 30}}


def test_a_gpu_process_fitbox_did_not_start_is_scouted(
    tmp_path: Path, engine: subprocess.Popen[bytes]
) -> None:
    settings = config.load({"home": str(tmp_path)}, env={"FITBOX_READING_INTERVAL": "0.01"})
    store = Store(tmp_path / "fitbox.sqlite3")

    def findings() -> list[tuple[str, str]]:
        store.flush()
        with contextlib.closing(sqlite3.connect(store.path)) as conn:
            return conn.execute("SELECT path, led_by FROM scout_findings").fetchall()

    async def until_scouted() -> list[tuple[str, str]]:
        task = asyncio.create_task(
            sense(settings, Registry(), ForeignProcessOnGpu(engine.pid), store, started_pids=set())
        )
        try:
            return await asyncio.to_thread(until, findings, "the foreign process scouted")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    try:
        found = asyncio.run(until_scouted())
    finally:
        store.close()
    ((path, led_by),) = found
    assert path.endswith("served-elsewhere.gguf")
    assert led_by.startswith("a process fitbox did not start appeared on gpu0: pid ")


def test_a_running_ollama_is_scouted_in_the_store_its_environment_names(tmp_path: Path) -> None:
    """A real process named ``ollama`` (tests/fakes/ollama) holds OLLAMA_MODELS; no setting
    of scout's own names that store."""
    store = tmp_path / "ollama-elsewhere"
    blob = "sha256-" + "12" * 32
    (store / "blobs").mkdir(parents=True)
    write_tiny_llama(store / "blobs" / blob, seed=3)
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "tinyo" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps(
            {
                "layers": [
                    {
                        "mediaType": "application/vnd.ollama.image.model",
                        "digest": "sha256:" + "12" * 32,
                    }
                ]
            }
        )
    )
    fake = Path(__file__).parent / "fakes" / "ollama"
    proc = subprocess.Popen(
        [str(fake), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "OLLAMA_MODELS": str(store)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        for pid in (None, proc.pid):  # every process, and --pid for that one
            report = scout(
                [], pid=pid, env={}, home=tmp_path / "home", mountinfo=tmp_path / "no-mountinfo"
            )
            (found,) = [f for f in report.findings if Path(f.path).name == blob]
            assert found.source == "ollama" and found.servable and found.evidence == LIVE
            assert f"OLLAMA_MODELS of the running ollama, pid {proc.pid}" in found.led_by
            assert found.name == "tinyo-latest"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()

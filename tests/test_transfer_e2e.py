"""Box to box: two real `fitbox serve` processes on loopback, each with its own home; a real
GGUF pulled from one into the other, every chunk verified as it lands. A cut connection is a
real TCP proxy that closes after a byte count (tests/fakes/cutting-proxy); a corrupted chunk
is a byte the test flips in the source's file while the pull runs, at a chunk the pull has
not reached (the flip happens when chunk 0 lands, in the last chunk, tens of MB beyond what
socket buffers can hold in flight)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fitbox.box.transfers import pull_from_box
from fitbox.models.box_pull import BoxPull, parse_box_spec
from fitbox.models.pull import PullError
from fitbox.models.transfer import CHUNK_BYTES
from fitbox.store.db import Store

from .support.ggufs import write_tiny_llama
from .support.holds import until
from .support.processes import FitboxProcess, running_fitbox
from .support.small_drive import SmallDrive, small_drive
from .support.splits import split_gguf

SMOL = "SmolLM2-135M-Instruct.Q4_1"
FAKES = Path(__file__).parent / "fakes"


@dataclass
class Source:
    box: FitboxProcess
    models: Path
    smol: Path  # the source's own copy (the corruption tests flip its bytes)
    sha256: str

    @property
    def port(self) -> int:
        return int(self.box.url.rsplit(":", 1)[1])


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Iterator[Source]:
    models = tmp_path_factory.mktemp("source-models")
    smol = models / smollm2.name
    shutil.copyfile(smollm2, smol)
    (models / ".hidden.gguf").write_bytes(b"secret")
    # a model whose GGUF is a symlink out of its directory: never offered
    outside = tmp_path_factory.mktemp("outside")
    write_tiny_llama(outside / "elsewhere.gguf")
    (models / "evil").mkdir()
    (models / "evil" / "evil.gguf").symlink_to(outside / "elsewhere.gguf")
    # a split model whose second shard links out of its directory: offered without it
    (models / "split").mkdir()
    write_tiny_llama(models / "split" / "split-00001-of-00002.gguf", seed=3)
    write_tiny_llama(outside / "split-00002-of-00002.gguf", seed=4)
    (models / "split" / "split-00002-of-00002.gguf").symlink_to(
        outside / "split-00002-of-00002.gguf"
    )
    # a whole split model, made by the real llama-gguf-split
    write_tiny_llama(outside / "whole.gguf", seed=5)
    split_gguf(outside / "whole.gguf", models / "whole", "whole", max_tensors=11)
    # a Hugging Face cache snapshot: a symlink into its own blobs/ is offered
    repo = models / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    write_tiny_llama(repo / "blobs" / "0123abcd")
    (repo / "snapshots" / "main").mkdir(parents=True)
    (repo / "snapshots" / "main" / "tiny.gguf").symlink_to("../../blobs/0123abcd")
    env = {"FITBOX_TRANSFER_MAX": "2"}
    with running_fitbox(tmp_path_factory.mktemp("source-home"), [models], env=env) as box:
        yield Source(box, models, smol, _sha256(smol))


@pytest.fixture
def dest(tmp_path: Path) -> Iterator[tuple[Path, Store]]:
    store = Store(tmp_path / "fitbox.sqlite3")
    try:
        yield tmp_path / "models", store
    finally:
        store.close()


@contextlib.contextmanager
def cutting_proxy(target: int, cut_after: int) -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, str(FAKES / "cutting-proxy"), str(target), str(cut_after)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def _pulls(store: Store) -> list[dict[str, object]]:
    store.flush()
    with contextlib.closing(sqlite3.connect(store.path)) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM pulls ORDER BY id")]


def test_manifest_lists_files_with_sha256_and_keeps_the_hash(source: Source) -> None:
    manifest = httpx.get(f"{source.box.url}/v1/transfer/{SMOL}/manifest", timeout=120).json()
    assert manifest == {
        "model": SMOL,
        "files": [
            {"path": source.smol.name, "bytes": source.smol.stat().st_size, "sha256": source.sha256}
        ],
    }
    sums = httpx.get(
        f"{source.box.url}/v1/transfer/{SMOL}/chunksums",
        params={"path": source.smol.name},
        timeout=60,
    ).json()
    with source.smol.open("rb") as f:
        first = hashlib.sha256(f.read(CHUNK_BYTES)).hexdigest()
    assert sums["chunk_bytes"] == CHUNK_BYTES and sums["chunks"][0] == first
    assert len(sums["chunks"]) == -(-source.smol.stat().st_size // CHUNK_BYTES)
    kept = httpx.get(f"{source.box.url}/v1/hashes", timeout=30).json()["data"]
    assert {k["sha256"] for k in kept} >= {source.sha256}


def test_a_hugging_face_blob_link_is_offered(source: Source) -> None:
    manifest = httpx.get(f"{source.box.url}/v1/transfer/tiny/manifest", timeout=60).json()
    assert [f["path"] for f in manifest["files"]] == ["tiny.gguf"]


def test_ranges_answer_206_and_bad_ranges_416(source: Source) -> None:
    url = f"{source.box.url}/v1/transfer/{SMOL}/file"
    size = source.smol.stat().st_size
    got = httpx.get(url, params={"path": source.smol.name}, headers={"range": "bytes=10-19"})
    assert got.status_code == 206
    assert got.headers["content-range"] == f"bytes 10-19/{size}"
    assert got.content == source.smol.read_bytes()[10:20]
    tail = httpx.get(url, params={"path": source.smol.name}, headers={"range": "bytes=-5"})
    assert tail.status_code == 206 and tail.content == source.smol.read_bytes()[-5:]
    for bad in (f"bytes={size}-", "bytes=5-2", "chars=0-1", "bytes=0-1,4-5"):
        refused = httpx.get(url, params={"path": source.smol.name}, headers={"range": bad})
        assert refused.status_code == 416, bad
        assert refused.json()["error"]["code"] == "range_not_satisfiable"


# Each tried: (raw query value as sent on the wire, expected status)
TRAVERSALS = [
    ("..", 403),
    ("../fitbox.sqlite3", 403),
    ("../../../../etc/passwd", 403),
    ("%2e%2e%2f%2e%2e%2fetc%2fpasswd", 403),  # encoded dots and slashes: decoded once, refused
    ("..%2f..%2fetc%2fpasswd", 403),
    ("%252e%252e%252fetc", 404),  # double-encoded: a literal name that is no file of the model
    ("/etc/passwd", 403),
    ("%2fetc%2fpasswd", 403),
    ("C:%5cWindows", 403),
    ("..%5c..%5cetc", 403),
    ("evil%2fevil.gguf", 403),
    ("models--org--tiny/blobs/0123abcd", 403),
    (".hidden.gguf", 403),
    (".", 403),
    ("", 403),
    ("%00", 403),
    ("no-such.gguf", 404),
]


@pytest.mark.parametrize(("raw", "status"), TRAVERSALS)
@pytest.mark.parametrize("route", ["file", "chunksums"])
def test_paths_outside_the_model_are_refused(
    source: Source, raw: str, status: int, route: str
) -> None:
    got = httpx.get(f"{source.box.url}/v1/transfer/{SMOL}/{route}?path={raw}", timeout=30)
    assert got.status_code == status, got.text
    error = got.json()["error"]
    assert set(error) >= {"message", "type", "code", "param"} and error["param"] == "path"
    assert str(source.models) not in got.text  # the reason, never the box's own paths


def test_a_symlink_out_of_the_model_directory_is_refused(source: Source) -> None:
    manifest = httpx.get(f"{source.box.url}/v1/transfer/evil/manifest", timeout=30).json()
    assert manifest["files"] == []
    got = httpx.get(f"{source.box.url}/v1/transfer/evil/file", params={"path": "evil.gguf"})
    assert got.status_code == 403
    assert "symlink out of the model's directory" in got.json()["error"]["message"]


def test_pull_from_another_box_end_to_end(source: Source, tmp_path: Path) -> None:
    home = tmp_path / "dest-home"
    with running_fitbox(home, []) as dest_box:
        spec = f"box://127.0.0.1:{source.port}/{SMOL}"
        argv = [sys.executable, "-m", "fitbox", "pull", spec, "--home", str(home)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        landed = home / "models" / source.smol.name
        assert _sha256(landed) == source.sha256
        assert not landed.with_name(landed.name + ".part").exists()
        assert SMOL in dest_box.models()  # the running box's catalog was refreshed
        again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert again.returncode == 1 and "already here" in again.stderr
        hashes = httpx.get(f"{dest_box.url}/v1/hashes", timeout=30).json()["data"]
        assert [h["sha256"] for h in hashes] == [source.sha256]
        (drive,) = httpx.get(f"{dest_box.url}/v1/storage", timeout=30).json()["data"]
        assert drive["role"] == "worker" and "first model root" in drive["role_from"]
    with contextlib.closing(sqlite3.connect(home / "fitbox.sqlite3")) as conn:
        rows = conn.execute(
            "SELECT bytes, seconds, outcome, verified, detail FROM pulls ORDER BY id"
        ).fetchall()
    (size, seconds, outcome, verified, _), refused = rows
    assert (size, outcome, verified) == (source.smol.stat().st_size, "ok", 1) and seconds > 0
    assert refused[2] == "error" and "already here" in refused[4]


def test_the_operator_action_pulls_and_refuses_what_is_here(source: Source, tmp_path: Path) -> None:
    with running_fitbox(tmp_path / "home", []) as dest_box:
        body = {"model": f"box://127.0.0.1:{source.port}/tiny"}
        got = httpx.post(f"{dest_box.url}/v1/operator/pull-model", json=body, timeout=120)
        assert got.status_code == 200, got.text
        assert "tiny" in dest_box.models()
        again = httpx.post(f"{dest_box.url}/v1/operator/pull-model", json=body, timeout=120)
        assert again.status_code == 409 and again.json()["error"]["code"] == "pull_refused"
        assert "already here" in again.json()["error"]["message"]


def _a_full_worker_drive_with_a_twin(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A worker drive holding tiny-x, its twin on a central drive, and a storage budget too
    small for tiny-x and another tiny beside it; reap_to_fit on (the fitbox env)."""
    worker, central = tmp_path / "nvme", tmp_path / "hdd"
    worker.mkdir()
    central.mkdir()
    write_tiny_llama(central / "tiny-x.gguf", seed=7)
    shutil.copy2(central / "tiny-x.gguf", worker / "tiny-x.gguf")
    size = (worker / "tiny-x.gguf").stat().st_size
    env = {
        "FITBOX_DRIVE_ROLES": f"{worker}=worker,{central}=central",
        "FITBOX_MOVERS": "reap_to_fit",
        "FITBOX_STORAGE_MAX": str(size + size // 2),
    }
    return worker, central, env


def test_a_pull_that_does_not_fit_reaps_a_worker_copy_with_a_central_twin_first(
    source: Source, tmp_path: Path
) -> None:
    worker, central, env = _a_full_worker_drive_with_a_twin(tmp_path)
    with running_fitbox(tmp_path / "home", [worker, central], env=env) as dest_box:
        body = {"model": f"box://127.0.0.1:{source.port}/tiny"}
        got = httpx.post(f"{dest_box.url}/v1/operator/pull-model", json=body, timeout=120)
        assert got.status_code == 200, got.text
        assert "tiny" in dest_box.models()
    assert sorted(p.name for p in worker.iterdir()) == ["tiny.gguf"]  # tiny-x made room
    assert (central / "tiny-x.gguf").is_file()
    with contextlib.closing(sqlite3.connect(tmp_path / "home" / "fitbox.sqlite3")) as conn:
        reaps = conn.execute(
            "SELECT target, detail FROM operator_actions WHERE action = 'reap'"
        ).fetchall()
    assert [target for target, _ in reaps] == [str(worker / "tiny-x.gguf")]
    assert "room to pull box://" in reaps[0][1]


def test_the_cli_asks_the_running_box_to_reap_and_says_why_not_without_one(
    source: Source, tmp_path: Path
) -> None:
    """`fitbox pull` cannot see the box's residents: with reap_to_fit on it asks the box
    serving its home to reap (the operator action); with none running, nothing is removed."""
    worker, central, env = _a_full_worker_drive_with_a_twin(tmp_path)
    home = tmp_path / "home"
    argv = [
        sys.executable,
        "-m",
        "fitbox",
        "pull",
        f"box://127.0.0.1:{source.port}/tiny",
        "--home",
        str(home),
        "--to",
        str(worker),
    ]
    alone = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )
    assert alone.returncode == 1 and f"no fitbox serves {home}" in alone.stderr
    assert (worker / "tiny-x.gguf").is_file() and not any(worker.glob("*.part"))
    with running_fitbox(home, [worker, central], env=env) as dest_box:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, env={**os.environ, **env}
        )
        assert done.returncode == 0, done.stderr
        assert "the running box reaped" in done.stderr
        assert "tiny" in dest_box.models()
    assert sorted(p.name for p in worker.iterdir()) == ["tiny.gguf"]  # tiny-x made room
    assert (central / "tiny-x.gguf").is_file()


def test_no_room_is_refused_before_a_byte_moves(source: Source, tmp_path: Path) -> None:
    spec = f"box://127.0.0.1:{source.port}/{SMOL}"
    argv = [sys.executable, "-m", "fitbox", "pull", spec, "--home", str(tmp_path)]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FITBOX_STORAGE_MAX": "1MiB"},
    )
    assert done.returncode == 1 and "reap first" in done.stderr
    assert not any((tmp_path / "models").glob("*.part"))


def test_a_key_that_is_not_valid_is_refused_by_the_source(source: Source, tmp_path: Path) -> None:
    spec = f"box://127.0.0.1:{source.port}/{SMOL}"
    argv = [sys.executable, "-m", "fitbox", "pull", spec, "--home", str(tmp_path)]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FITBOX_SOURCE_KEY": "fb_000000000000_" + "x" * 43},
    )
    assert done.returncode == 1 and "401" in done.stderr and "not valid" in done.stderr


def test_a_cut_connection_resumes_at_the_last_verified_chunk(
    source: Source, dest: tuple[Path, Store]
) -> None:
    models, store = dest
    seen: list[tuple[str, int]] = []
    cut_at = 2 * CHUNK_BYTES + CHUNK_BYTES // 2  # mid chunk 2 (plus the response's headers)
    with cutting_proxy(source.port, cut_at) as port:
        (outcome,) = pull_from_box(
            f"box://127.0.0.1:{port}/{SMOL}",
            models,
            store,
            events=lambda kind, _name, index: seen.append((kind, index)),
        )
    assert _sha256(outcome.path) == source.sha256
    assert outcome.cuts == 1
    ok = [index for kind, index in seen if kind == "chunk_ok"]
    assert ok == list(range(len(ok))), "each chunk verified once, in order"
    assert ("cut", 2) in seen
    # only the half chunk the cut broke was fetched twice
    assert outcome.size < outcome.fetched_bytes < outcome.size + CHUNK_BYTES


def test_a_part_left_behind_is_resumed_where_its_chunks_verify(
    source: Source, dest: tuple[Path, Store]
) -> None:
    models, store = dest

    def stop_at_the_cut(kind: str, _name: str, _index: int) -> None:
        if kind == "cut":
            raise Stopped  # as if the pulling process were stopped there

    cut_at = 3 * CHUNK_BYTES + 4096  # the response headers and 3 whole chunks, and a bit
    with cutting_proxy(source.port, cut_at) as port, pytest.raises(Stopped):
        pull_from_box(f"box://127.0.0.1:{port}/{SMOL}", models, store, events=stop_at_the_cut)
    part = models / f"{source.smol.name}.part"
    assert part.stat().st_size == 3 * CHUNK_BYTES  # the broken chunk was cut off
    with part.open("r+b") as f:  # damage chunk 2 of the staging file: it must not be kept
        f.seek(2 * CHUNK_BYTES + 7)
        f.write(b"\xff" if f.read(1) != b"\xff" else b"\x00")
    (outcome,) = pull_from_box(f"box://127.0.0.1:{source.port}/{SMOL}", models, store)
    assert outcome.reused_chunks == 2
    assert outcome.fetched_bytes == outcome.size - 2 * CHUNK_BYTES
    assert _sha256(outcome.path) == source.sha256
    (row,) = _pulls(store)
    assert row["outcome"] == "ok" and json.loads(str(row["detail"]))["reused_chunks"] == 2


class Stopped(Exception):
    pass


@contextlib.contextmanager
def flipped(path: Path, offset: int) -> Iterator[None]:
    """One byte of ``path`` flipped (its mtime kept, as a silent disk error would)."""
    st = path.stat()
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    try:
        yield
    finally:
        with path.open("r+b") as f:
            f.seek(offset)
            f.write(byte)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_corrupted_chunk_is_refused_and_fetched_again(
    source: Source, dest: tuple[Path, Store]
) -> None:
    models, store = dest
    last = (source.smol.stat().st_size - 1) // CHUNK_BYTES
    flips = contextlib.ExitStack()
    seen: list[tuple[str, int]] = []

    def on_event(kind: str, _name: str, index: int) -> None:
        seen.append((kind, index))
        if (kind, index) == ("chunk_ok", 0):
            flips.enter_context(flipped(source.smol, last * CHUNK_BYTES + 3))
        if kind == "chunk_bad":
            flips.close()  # the source is whole again: the re-fetch verifies

    with flips:
        (outcome,) = pull_from_box(
            f"box://127.0.0.1:{source.port}/{SMOL}", models, store, events=on_event
        )
    assert ("chunk_bad", last) in seen and outcome.refetched_chunks == 1
    assert _sha256(outcome.path) == source.sha256


def test_a_chunk_that_never_verifies_fails_the_pull(
    source: Source, dest: tuple[Path, Store]
) -> None:
    models, store = dest
    with flipped(source.smol, 5), pytest.raises(PullError, match="failed its sha256 4 times"):
        pull_from_box(f"box://127.0.0.1:{source.port}/{SMOL}", models, store)
    assert not (models / source.smol.name).exists()


def test_transfers_beyond_the_cap_wait_with_429(source: Source) -> None:
    url = f"{source.box.url}/v1/transfer/{SMOL}/file"
    params = {"path": source.smol.name}
    with contextlib.ExitStack() as held:
        for _ in range(2):  # the cap (FITBOX_TRANSFER_MAX=2): bodies left unread, held open
            client = held.enter_context(httpx.Client(timeout=30))
            response = held.enter_context(client.stream("GET", url, params=params))
            assert response.status_code == 200
        refused = httpx.get(url, params=params, timeout=30)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
        assert refused.json()["error"]["code"] == "too_many_transfers"
    tail = {"range": "bytes=-4"}
    until(
        lambda: httpx.get(url, params=params, headers=tail).status_code == 206,
        "a slot is free once the held transfers are closed",
    )


def test_a_key_without_the_admin_scope_is_refused_even_from_the_box(source: Source) -> None:
    made = httpx.post(f"{source.box.url}/v1/keys", json={"name": "infer", "scopes": ["inference"]})
    key = made.json()["key"]
    headers = {"authorization": f"Bearer {key}"}
    for route in (
        "manifest",
        f"file?path={source.smol.name}",
        f"chunksums?path={source.smol.name}",
    ):
        got = httpx.get(f"{source.box.url}/v1/transfer/{SMOL}/{route}", headers=headers)
        assert got.status_code == 403 and got.json()["error"]["code"] == "insufficient_scope"
    box_key = (source.box.home / "box.key").read_text().strip()  # an admin key
    got = httpx.get(
        f"{source.box.url}/v1/transfer/{SMOL}/manifest",
        timeout=60,
        headers={"authorization": f"Bearer {box_key}"},
    )
    assert got.status_code == 200


def test_a_model_that_offers_no_file_is_no_pull(source: Source, dest: tuple[Path, Store]) -> None:
    models, store = dest
    with pytest.raises(PullError, match="offers no file of evil"):
        pull_from_box(f"box://127.0.0.1:{source.port}/evil", models, store)
    assert not models.exists() or not any(models.iterdir())


def test_a_split_model_offered_without_a_shard_is_no_pull(
    source: Source, dest: tuple[Path, Store]
) -> None:
    models, store = dest
    listed = httpx.get(f"{source.box.url}/v1/transfer/split/manifest", timeout=60).json()
    assert [f["path"] for f in listed["files"]] == ["split-00001-of-00002.gguf"]
    with pytest.raises(
        PullError,
        match=r"without split-00002-of-00002\.gguf: a split GGUF is "
        "pulled whole",
    ):
        pull_from_box(f"box://127.0.0.1:{source.port}/split", models, store)
    assert not models.exists() or not any(models.iterdir())


def test_a_split_model_is_pulled_whole_and_named_only_once_every_shard_verified(
    source: Source, dest: tuple[Path, Store]
) -> None:
    """At each verified chunk (the events come on the pull's own thread, in order) no shard
    is in place yet: the renames come after the last, shard 1's last."""
    models, store = dest
    shards = sorted((source.models / "whole").iterdir())
    landed: list[list[str]] = []

    def look(kind: str, _name: str, _index: int) -> None:
        if kind == "chunk_ok":
            landed.append(sorted(p.name for p in models.glob("*.gguf")))

    outcomes = pull_from_box(f"box://127.0.0.1:{source.port}/whole", models, store, events=look)
    assert [o.name for o in outcomes] == [s.name for s in shards]
    assert len(landed) == len(shards) and landed == [[]] * len(shards)
    assert sorted(p.name for p in models.iterdir()) == [s.name for s in shards]  # no .part
    assert [_sha256(models / s.name) for s in shards] == [_sha256(s) for s in shards]


def test_a_split_pull_stopped_between_its_renames_is_finished_by_the_next(
    source: Source, dest: tuple[Path, Store]
) -> None:
    """Shard 2 in place and shard 1 not (what a pull stopped after its first rename, the
    last shard's, leaves): the next pull hashes shard 2 here, keeps it, fetches shard 1
    only. With other bytes under shard 2's name it is refused, the file left alone."""
    models, store = dest
    shards = sorted((source.models / "whole").iterdir())
    models.mkdir(parents=True)
    shutil.copyfile(shards[1], models / shards[1].name)
    first, second = pull_from_box(f"box://127.0.0.1:{source.port}/whole", models, store)
    assert second.fetched_bytes == 0 and second.reused_chunks == len(second.chunks) == 1
    assert first.fetched_bytes == shards[0].stat().st_size
    assert [_sha256(models / s.name) for s in shards] == [_sha256(s) for s in shards]
    for path in models.iterdir():
        path.unlink()
    (models / shards[1].name).write_bytes(b"not the shard")
    with pytest.raises(PullError, match="exists with other bytes"):
        pull_from_box(f"box://127.0.0.1:{source.port}/whole", models, store)
    assert sorted(p.name for p in models.iterdir()) == [shards[1].name]


def test_a_drive_that_refuses_o_direct_lands_the_pull_through_the_page_cache(
    source: Source, tmp_path: Path
) -> None:
    """ramfs refuses O_DIRECT (this box's ext4 and tmpfs take it): every piece goes through
    the page cache instead, and the file verifies the same. (ramfs says it has 0 bytes
    free, so the room check is left out, as the full-drive test does.)"""
    with small_drive(tmp_path / "ramfs", fstype="ramfs") as drive:
        with pytest.raises(OSError):  # the drive really has no O_DIRECT
            os.open(drive.path / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
        puller = BoxPull(
            parse_box_spec(f"box://127.0.0.1:{source.port}/{SMOL}"), drive.path / "models"
        )
        (outcome,) = puller.run()
        assert outcome.sha256 == source.sha256 and outcome.refetched_chunks == 0
        assert _sha256(drive.path / "models" / source.smol.name) == source.sha256
        (drive.path / "models" / source.smol.name).unlink()  # ramfs holds it in memory


def test_a_source_that_is_not_a_fitbox_is_refused_with_what_it_said(tmp_path: Path) -> None:
    """A web server that answers the manifest's route with a page, not JSON (here Python's
    own http.server, serving a file at that path)."""
    page = tmp_path / "v1" / "transfer" / "x" / "manifest"
    page.parent.mkdir(parents=True)
    page.write_text("<html>not a fitbox</html>")
    server = subprocess.Popen(
        [
            sys.executable,
            "-u",
            "-m",
            "http.server",
            "0",
            "--bind",
            "127.0.0.1",
            "-d",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split(" port ")[1].split()[0])
        puller = BoxPull(parse_box_spec(f"box://127.0.0.1:{port}/x"), tmp_path / "models")
        with pytest.raises(PullError, match="not JSON: b'<html>not a fitbox"):
            puller.run()
    finally:
        server.kill()
        server.wait()
        if server.stdout:
            server.stdout.close()


def test_a_drive_that_fills_mid_pull_ends_it_with_the_reason(
    source: Source, drive: SmallDrive
) -> None:
    """The 20 MB drive said there was room (its check is bypassed here, as if another writer
    filled it after the check); the write that fails ends the pull, not a retry loop."""
    seen: list[str] = []
    puller = BoxPull(
        parse_box_spec(f"box://127.0.0.1:{source.port}/{SMOL}"),
        drive.path / "models",
        events=lambda kind, _n, _i: seen.append(kind),
    )
    with pytest.raises(PullError, match=r"could not write .*No space left"):
        puller.run()
    assert "cut" not in seen and 0 < seen.count("chunk_ok") < 25

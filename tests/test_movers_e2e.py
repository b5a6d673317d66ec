"""The movers on a real fitbox with real llama-server: a worker root and a central root
(tmp dirs with roles set), SmolLM2 only on the central drive, a tiny llama only on the
worker drive.

- upload_to_worker: the first call to SmolLM2 copies it to the worker drive (verified) and
  the engine loads the copy;
- copy_to_central: the tiny llama, after its first load, is copied to the central drive;
- reap_to_fit as an operator action: the tiny llama's worker copy (now with a central twin,
  unloaded) is removed; SmolLM2's (resident) is not; the next call uploads it again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from pathlib import Path

import httpx
import pytest

from .support.ggufs import write_tiny_llama
from .support.holds import until
from .support.processes import running_fitbox
from .support.splits import split_gguf

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_upload_copy_back_and_reap_on_a_real_box(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    worker, central = tmp_path / "nvme" / "models", tmp_path / "hdd" / "models"
    central.mkdir(parents=True)
    worker.mkdir(parents=True)
    shutil.copy2(smollm2, central / smollm2.name)
    write_tiny_llama(worker / "tiny-w.gguf", seed=5)
    env = {
        "FITBOX_DRIVE_ROLES": f"{worker}=worker,{central}=central",
        "FITBOX_MOVERS": "upload_to_worker,copy_to_central,reap_to_fit",
    }
    # the central drive first: a name held on both is its central file to the catalog
    with running_fitbox(tmp_path / "home", [central, worker], env=env) as box:
        reply = httpx.post(
            f"{box.url}/v1/chat/completions",
            timeout=120,
            json={"model": SMOL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert reply.status_code == 200, reply.text
        copy = worker / smollm2.name
        assert copy.is_file() and sha256(copy) == sha256(central / smollm2.name)
        assert not list(worker.glob("*.part"))
        residents = httpx.get(f"{box.url}/v1/residents", timeout=30).json()["data"]
        assert [r["artifact"] for r in residents] == [str(copy)]  # the load read the copy
        assert box.calls()[-1]["artifact"] == str(copy)

        # the tiny llama lives on the worker drive only: its first load copies it back
        tiny = httpx.post(
            f"{box.url}/v1/completions",
            timeout=120,
            json={"model": "tiny-w", "prompt": "hi", "max_tokens": 1},
        )
        assert tiny.status_code == 200, tiny.text
        back = central / "tiny-w.gguf"
        until(back.is_file, "tiny-w copied to the central drive")
        assert sha256(back) == sha256(worker / "tiny-w.gguf")

        unloaded = httpx.post(f"{box.url}/v1/operator/unload", json={"model": "tiny-w"}, timeout=60)
        assert unloaded.status_code == 200, unloaded.text
        huge = shutil.disk_usage(worker).free + (1 << 40)  # more than can ever be freed
        reaped = httpx.post(
            f"{box.url}/v1/operator/reap-to-fit", json={"bytes": huge}, timeout=60
        ).json()
        assert reaped["removed"] == [str(worker / "tiny-w.gguf")]
        assert reaped["short_by_bytes"] > 0
        kept = {Path(k["path"]).name: k["why"] for k in reaped["kept"]}
        assert kept == {smollm2.name: "its model is resident"}
        assert not (worker / "tiny-w.gguf").exists() and copy.is_file() and back.is_file()
        # the catalog was refreshed: tiny-w answers from its central copy, uploaded again
        again = httpx.post(
            f"{box.url}/v1/completions",
            timeout=120,
            json={"model": "tiny-w", "prompt": "hi", "max_tokens": 1},
        )
        assert again.status_code == 200, again.text
        # SmolLM2 by name is its central file; the resident is the worker copy
        pinned = httpx.post(f"{box.url}/v1/operator/unpin", json={"model": SMOL}, timeout=60)
        assert pinned.status_code == 200, pinned.text
        unloaded = httpx.post(f"{box.url}/v1/operator/unload", json={"model": SMOL}, timeout=60)
        assert unloaded.status_code == 200, unloaded.text
        left = httpx.get(f"{box.url}/v1/residents", timeout=30).json()["data"]
        assert str(copy) not in [r["artifact"] for r in left]
        bad = httpx.post(f"{box.url}/v1/operator/reap-to-fit", json={"bytes": "lots"}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "bytes"

    with sqlite3.connect(box.home / "fitbox.sqlite3") as conn:
        done = [
            tuple(r)
            for r in conn.execute(
                "SELECT action, target, outcome FROM operator_actions ORDER BY id"
            )
        ]
    assert ("upload-to-worker", SMOL, "ok") in done
    assert ("copy-to-central", "tiny-w", "ok") in done
    assert ("reap", str(worker / "tiny-w.gguf"), "ok") in done
    assert ("reap-to-fit", None, "ok") in done
    assert sorted(os.listdir(worker)) == sorted([smollm2.name, "tiny-w.gguf"])


def test_a_split_gguf_is_uploaded_whole_loaded_from_the_worker_and_reaped_whole(
    tmp_path: Path, smollm2: Path, llama_server_bin: Path
) -> None:
    """SmolLM2 split by the real llama-gguf-split, on the central drive only: the first call
    uploads every shard and the engine loads the worker's set (llama-server opens the
    siblings of the first shard itself); unloaded, the set is reaped as one."""
    worker, central = tmp_path / "nvme" / "models", tmp_path / "hdd" / "models"
    worker.mkdir(parents=True)
    shards = split_gguf(smollm2, central / "smol", "smol-split", max_tensors=100)
    env = {
        "FITBOX_DRIVE_ROLES": f"{worker}=worker,{central}=central",
        "FITBOX_MOVERS": "upload_to_worker,reap_to_fit",
    }
    with running_fitbox(tmp_path / "home", [central, worker], env=env) as box:
        reply = httpx.post(
            f"{box.url}/v1/chat/completions",
            timeout=120,
            json={
                "model": "smol-split",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        assert reply.status_code == 200, reply.text
        copies = [worker / "smol" / s.name for s in shards]
        assert sorted(os.listdir(worker / "smol")) == [s.name for s in shards]  # no .part
        assert [sha256(c) for c in copies] == [sha256(s) for s in shards]
        residents = httpx.get(f"{box.url}/v1/residents", timeout=30).json()["data"]
        assert [r["artifact"] for r in residents] == [str(copies[0])]
        unloaded = httpx.post(
            f"{box.url}/v1/operator/unload", json={"model": "smol-split"}, timeout=60
        )
        assert unloaded.status_code == 200, unloaded.text
        huge = shutil.disk_usage(worker).free + (1 << 40)
        reaped = httpx.post(
            f"{box.url}/v1/operator/reap-to-fit", json={"bytes": huge}, timeout=60
        ).json()
        assert reaped["removed"] == [str(c) for c in copies], reaped
        assert os.listdir(worker / "smol") == []  # every shard went with the first
        assert all(s.is_file() for s in shards)

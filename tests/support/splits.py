"""Split GGUFs made by the real ``llama-gguf-split`` that ships beside llama-server."""

from __future__ import annotations

import subprocess
from pathlib import Path

from fitbox.engines.llama_server import find_binary


def split_gguf(source: Path, dest_dir: Path, name: str, max_tensors: int) -> list[Path]:
    """``source`` split into ``dest_dir/NAME-0000i-of-0000N.gguf`` (at most ``max_tensors``
    tensors a shard); the shards, the first first. A failure is the test's, with its output."""
    tool = find_binary().path.with_name("llama-gguf-split")
    dest_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            str(tool),
            "--split",
            "--split-max-tensors",
            str(max_tensors),
            str(source),
            str(dest_dir / name),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"llama-gguf-split failed:\n{done.stdout[-2000:]}{done.stderr}")
    shards = sorted(dest_dir.glob(f"{name}-*-of-*.gguf"))
    if len(shards) < 2:
        raise RuntimeError(f"llama-gguf-split made {len(shards)} shard(s) of {source}")
    return shards

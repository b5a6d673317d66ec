"""The command line as a user runs it: a real `python -m fitbox` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .support.ggufs import write_projector, write_tiny_llama


def fitbox(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fitbox", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "FITBOX_HOME": str(home),
            # the fitbox under test, where a PYTHONPATH names it (a worktree's src)
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        },
    )


def test_models_lists_the_catalog_as_text_and_json(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny.gguf")
    write_projector(root / "mmproj-tiny.gguf")
    (tmp_path / "aliases.toml").write_text('[aliases]\nsmall = "tiny"\n')
    text = fitbox("models", "--models", str(root), home=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "tiny (aka small)  llama" in text.stdout and "mmproj" not in text.stdout
    assert "(gguf) vision" in text.stdout  # the projector beside it: the model reads images
    (root / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00")
    rows = json.loads(fitbox("models", "--json", "--models", str(root), home=tmp_path).stdout)
    assert [(r["name"], r.get("aliases"), r.get("context_length")) for r in rows] == [
        ("tiny", ["small"], 512),
        (None, None, None),
    ]
    assert "not a readable GGUF" in rows[1]["rejected"]
    assert rows[0]["vision"] and rows[0]["mmproj"] == str(root / "mmproj-tiny.gguf")
    text = fitbox("models", "--models", str(root), home=tmp_path)
    assert "not servable:" in text.stderr and "broken.gguf" in text.stderr


def test_models_reads_the_default_root_under_the_home(tmp_path: Path) -> None:
    empty = fitbox("models", home=tmp_path)
    assert empty.returncode == 0 and "run 'fitbox pull'" in empty.stdout
    (tmp_path / "models").mkdir()
    write_tiny_llama(tmp_path / "models" / "here.gguf")
    assert "here" in fitbox("models", home=tmp_path).stdout


def test_a_bad_setting_names_itself_and_exits_2(tmp_path: Path) -> None:
    result = fitbox("serve", "--ram-max", "lots", home=tmp_path)
    assert result.returncode == 2
    assert "Setting 'ram_max' (FITBOX_RAM_MAX) has value 'lots'" in result.stderr


def test_a_limit_above_its_parent_tier_is_refused_at_start_with_the_reason(
    tmp_path: Path,
) -> None:
    result = fitbox("serve", "--ram-max", "1000TiB", "--port", "auto", home=tmp_path)
    assert result.returncode == 2
    assert "ram: the box setting 1099511627776000 is above what the device has" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "fitbox", "serve", "--port", "auto"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "FITBOX_HOME": str(tmp_path),
            "FITBOX_SIMULATED_GPUS": "8GiB",
            "FITBOX_VRAM_MAX": "9GiB",
        },
    )
    assert result.returncode == 2 and "vram:gpu0: the box setting" in result.stderr


def test_pull_refuses_a_source_it_cannot_check(tmp_path: Path) -> None:
    result = fitbox("pull", "http://127.0.0.1:9/x.gguf", home=tmp_path)
    assert result.returncode == 1 and "--sha256" in result.stderr


def test_serve_refuses_a_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = fitbox("serve", "--port", port, home=tmp_path)
    assert result.returncode == 1 and "cannot listen" in result.stderr


def test_every_command_is_registered_once_and_settings_never_prints_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fitbox.cli import COMMANDS, main

    names = [c.name for c in COMMANDS]
    assert len(names) == len(set(names)) and {"serve", "central", "settings"} <= set(names)
    monkeypatch.setenv("FITBOX_HOME", str(tmp_path))
    monkeypatch.setenv("FITBOX_CENTRAL_KEY", "fbk_worker_secret")
    assert main(["settings"]) == 0
    printed = capsys.readouterr().out
    assert "central_key = (set)" in printed and "fbk_worker_secret" not in printed
    assert f"home = {tmp_path!r}" in printed  # what is not secret is shown


def test_a_plan_that_refuses_exits_1_with_each_rung_s_reason(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny.gguf")
    refused = fitbox("plan", "tiny@gpu", "--models", str(root), home=tmp_path)
    assert refused.returncode == 1, refused.stdout
    assert "needs 0 B" not in refused.stdout  # no rung was sized: nothing to weigh
    assert "no_candidate: no rung of it can be placed on this box" in refused.stdout
    assert "gpu-only tiny: no_gpu (this box has no GPU)" in refused.stdout
    as_json = fitbox("plan", "tiny@gpu", "--json", "--models", str(root), home=tmp_path)
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["decision"] == "refuse"
    placed = fitbox("plan", "tiny", "--models", str(root), home=tmp_path)
    assert placed.returncode == 0, placed.stdout


def test_output_piped_into_a_reader_that_left_ends_quietly(tmp_path: Path) -> None:
    """``fitbox models --json | head -1``: the reader gone before fitbox writes (its end of
    the pipe closed first, so the write fails whatever the buffer holds) ends without a
    traceback, with the status a shell gives a tool a closed pipe stopped."""
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny.gguf")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        gone = subprocess.run(
            [sys.executable, "-m", "fitbox", "models", "--json", "--models", str(root)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, "FITBOX_HOME": str(tmp_path)},
        )
    finally:
        os.close(write_end)
    assert gone.stderr == "" and gone.returncode == 141

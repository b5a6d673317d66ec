"""`fitbox config TOOL --write` and `fitbox launch TOOL` against a running box serving
SmolLM2, each tool installed from its registry (tests/support/harness_tools.py) and run
with a home of its own, so that what it reads is what fitbox wrote.

Run to the end, the call's row ``ok``: aider, Continue's CLI and llm. OpenCode until its
first call ends ``ok`` (its agent goes on for more turns than a test waits for). Until their
first call reaches the box (its row names the model), then stopped: Codex, Claude Code, pi
and Qwen Code, whose system prompts alone are longer than SmolLM2's window or whose turns on
it outlast a test (the row proves the tool read fitbox's config and called here).
OpenCode's config is also read back by its own loader (``opencode debug config``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support.harness_tools import npm_bin, pip_bin
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[FitboxProcess]:
    with running_fitbox(tmp_path_factory.mktemp("box") / "home", [smollm2.parent]) as served:
        yield served


@pytest.fixture(scope="module")
def bins() -> str:
    return f"{npm_bin()}{os.pathsep}{pip_bin()}"


def user_env(home: Path, bins: str) -> dict[str, str]:
    """A person's environment with a home of its own (the tools read their config there)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "ANTHROPIC_", "LLM_", "OPENCODE_", "CODEX_"))
    }
    return {
        **env,
        "HOME": str(home),
        "PATH": f"{bins}{os.pathsep}{os.environ['PATH']}",
        "XDG_CONFIG_HOME": str(home / ".config"),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "DISABLE_AUTOUPDATER": "1",
        "NO_COLOR": "1",
    }


def fitbox(box: FitboxProcess, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fitbox", *args[:2], "--home", str(box.home), *args[2:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def new_rows(box: FitboxProcess, before: int) -> list[dict[str, Any]]:
    return [r for r in box.calls() if r["id"] > before and r["model_asked"] == SMOL]


def last_id(box: FitboxProcess) -> int:
    return max((r["id"] for r in box.calls()), default=0)


def run_to_end(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 400) -> str:
    result = subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, (
        f"{argv[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result.stdout


def run_until_a_call(
    box: FitboxProcess,
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    timeout: float = 240,
    outcome: str | None = None,
) -> dict[str, Any]:
    """The tool's first call row on the box (with ``outcome``: the first that ended so); the
    tool is stopped once it is there."""
    before = last_id(box)
    log = cwd / f"{Path(argv[0]).name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = [
                r
                for r in box.calls(settle=0)
                if r["id"] > before
                and r["model_asked"] == SMOL
                and (outcome is None or r["outcome"] == outcome)
            ]
            if rows:
                return rows[0]
            if proc.poll() is not None and not rows:
                time.sleep(1)
                rows = new_rows(box, before)
                assert rows, (
                    f"{argv[0]} exited {proc.returncode} with no call:\n{log.read_text()[-3000:]}"
                )
                return rows[0]
            time.sleep(0.5)
        raise AssertionError(f"{argv[0]} made no call in {timeout}s:\n{log.read_text()[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def written(box: FitboxProcess, env: dict[str, str], tool: str) -> str:
    result = fitbox(box, env, "config", tool, "--write")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_aider_runs_from_the_config_fitbox_wrote_and_from_launch(
    box: FitboxProcess, bins: str, tmp_path: Path
) -> None:
    env = user_env(tmp_path / "home", bins)
    said = written(box, env, "aider")
    home = tmp_path / "home"
    assert f"{home}/.aider.conf.yml: wrote" in said
    metadata = json.loads((home / ".aider.model.metadata.json").read_text())
    window = httpx.get(f"{box.url}/v1/plan", params={"model": SMOL}).json()["window"]
    assert metadata[f"openai/{SMOL}"]["max_input_tokens"] == window
    quiet = ["--yes", "--no-git", "--no-check-update", "--no-analytics", "--no-show-model-warnings"]
    work = tmp_path / "work"
    work.mkdir()
    before = last_id(box)
    out = run_to_end(["aider", "--message", "Say hi.", *quiet], env, work)
    assert f"Model: openai/{SMOL}" in out
    assert [r["outcome"] for r in new_rows(box, before)][-1:] == ["ok"]

    bare = user_env(tmp_path / "bare", bins)  # no config of its own: launch sets it all
    before = last_id(box)
    argv = [sys.executable, "-m", "fitbox", "launch", "aider", "--home", str(box.home)]
    run_to_end([*argv, "--", "--message", "Say hi.", *quiet], bare, work)
    assert [r["outcome"] for r in new_rows(box, before)][-1:] == ["ok"]
    assert not (tmp_path / "bare" / ".aider.conf.yml").exists()  # nothing of the user's


def test_opencode_reads_the_provider_fitbox_wrote_and_runs_on_it(
    box: FitboxProcess, bins: str, tmp_path: Path
) -> None:
    env = user_env(tmp_path / "home", bins)
    config = tmp_path / "home" / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"autoupdate": False, "share": "disabled"}))
    said = written(box, env, "opencode")
    assert "backup:" in said
    work = tmp_path / "work"
    work.mkdir()
    seen = json.loads(run_to_end(["opencode", "debug", "config"], env, work, timeout=120))
    assert seen["autoupdate"] is False and seen["share"] == "disabled"  # the user's, kept
    provider = seen["provider"]["fitbox"]
    window = httpx.get(f"{box.url}/v1/plan", params={"model": SMOL}).json()["window"]
    assert provider["models"][SMOL]["limit"] == {"context": window, "output": window // 4}
    assert provider["options"]["baseURL"] == f"{box.url}/v1"
    assert seen["model"] == f"fitbox/{SMOL}"
    # its agent may go on for turns (tools, a title, a summary) that SmolLM2 answers slowly
    # on a busy machine: the first whole call is the proof, then it is stopped
    row = run_until_a_call(box, ["opencode", "run", "Say hi."], env, work, 500, outcome="ok")
    assert row["endpoint"] == "/v1/chat/completions" and row["http_status"] == 200


def test_continue_cli_and_llm_run_from_their_written_configs(
    box: FitboxProcess, bins: str, tmp_path: Path
) -> None:
    env = user_env(tmp_path / "home", bins)
    work = tmp_path / "work"
    work.mkdir()
    written(box, env, "continue")
    before = last_id(box)
    config = tmp_path / "home" / ".continue" / "config.yaml"
    run_to_end(["cn", "--config", str(config), "-p", "Say hi."], env, work)
    assert [r["outcome"] for r in new_rows(box, before)][-1:] == ["ok"]

    llm_home = tmp_path / "home" / ".config" / "io.datasette.llm"
    written(box, {**env, "LLM_USER_PATH": str(llm_home)}, "llm")
    before = last_id(box)
    run_to_end(
        ["llm", "-m", f"fitbox/{SMOL}", "Say hi."], {**env, "LLM_USER_PATH": str(llm_home)}, work
    )
    assert [r["outcome"] for r in new_rows(box, before)] == ["ok"]
    before = last_id(box)
    launch = [sys.executable, "-m", "fitbox", "launch", "llm", "--home", str(box.home), "--", "Hi."]
    run_to_end(launch, user_env(tmp_path / "bare", bins), work)
    assert [r["outcome"] for r in new_rows(box, before)] == ["ok"]


@pytest.mark.parametrize(
    ("tool", "argv", "endpoint"),
    [
        (
            "codex",
            ["codex", "exec", "--skip-git-repo-check", "-p", "fitbox", "Say hi."],
            "/v1/responses",
        ),
        ("claude", ["claude", "-p", "Say hi."], "/v1/messages"),
        (
            "pi",
            ["pi", "-p", "--provider", "fitbox", "--model", SMOL, "Say hi."],
            "/v1/chat/completions",
        ),
        ("qwen", ["qwen", "Say hi."], "/v1/chat/completions"),
    ],
)
def test_agents_call_the_box_from_the_config_fitbox_wrote(
    box: FitboxProcess, bins: str, tmp_path: Path, tool: str, argv: list[str], endpoint: str
) -> None:
    env = user_env(tmp_path / "home", bins)
    written(box, env, tool)
    work = tmp_path / "work"
    work.mkdir()
    row = run_until_a_call(box, argv, env, work)
    assert row["endpoint"] == endpoint


def test_a_tool_off_the_box_gets_an_inference_key_limited_to_its_model(
    box: FitboxProcess, tmp_path: Path
) -> None:
    env = user_env(tmp_path / "home", "")
    result = fitbox(box, env, "config", "env", "--remote", "--model", SMOL, "--model", "nope")
    assert result.returncode == 0, result.stderr
    assert "# not written: nope: The model 'nope' does not exist" in result.stdout
    key = next(
        line.split("=", 1)[1] for line in result.stdout.splitlines() if "OPENAI_API_KEY=" in line
    )
    assert key.startswith("fb_") and key in result.stderr  # shown this once
    made = next(
        k for k in httpx.get(f"{box.url}/v1/keys").json()["data"] if key.startswith(f"fb_{k['id']}")
    )
    assert made["scopes"] == ["inference"] and made["models"] == [SMOL]
    nothing = fitbox(box, env, "config", "aider", "--model", "nope")
    assert nothing.returncode == 1 and "nope: The model 'nope' does not exist" in nothing.stderr

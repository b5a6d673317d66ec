"""An engine built without a GPU backend on a box that has GPUs: placed in RAM, never priced
on a GPU it cannot reach (a llama-server that pip built where no CUDA toolkit was, loaded
with -ngl 99, put everything in RAM the room never charged, and its claim was one core).

The core is given the engine's answer; llama-server's answer is read from this box's real
binary (built without one: ``--list-devices`` lists none) and from scripts that answer as
a CUDA build and an old build do. A GPU that NVML would report is an in-process probe
(this machine has no GPU); a declared simulated inventory keeps its GPUs usable.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from fitbox import config as settings
from fitbox.box.box import Box
from fitbox.core.ask import Ask, Candidate
from fitbox.core.decide import decide
from fitbox.core.decision import Place, Refuse
from fitbox.core.types import Rung, Snapshot
from fitbox.engines.kinds import EngineKinds
from fitbox.engines.llama_server import LlamaServer, inspect
from fitbox.models.catalog import Catalog
from fitbox.probe.gpus import GpuProbe, GpuReading, SimulatedGpus
from tests.support.core_builders import GiB, gpu, host, model
from tests.support.engine_help import HELP, SYSTEM_INFO
from tests.support.ggufs import write_tiny_llama

CORES = tuple(range(4))


def test_a_candidate_whose_engine_has_no_gpu_backend_is_placed_in_ram_and_says_why() -> None:
    # a GPU the probe reads (a declared one is taken at its word: core/room.py declared_gpus)
    snap = Snapshot((replace(gpu(0, 24 * GiB), simulated=False), host(64 * GiB)), (), cores=CORES)
    on_gpu = decide(snap, _ask(model("m", 4 * GiB, quant="Q4_0")))
    assert isinstance(on_gpu, Place) and on_gpu.rung is Rung.GPU_ONLY and on_gpu.gpu_layers
    assert len(on_gpu.cores) == 1  # a GPU-only engine's claim

    cpu_only = decide(snap, _ask(model("m", 4 * GiB, quant="Q4_0", on_gpus=False)))
    assert isinstance(cpu_only, Place), cpu_only
    assert cpu_only.rung is Rung.RAM_ONLY and cpu_only.gpu_layers == 0
    assert cpu_only.bytes_on("host") > 4 * GiB and cpu_only.bytes_on("gpu0") == 0
    assert len(cpu_only.cores) == len(CORES)  # weights in RAM: every core, the lent one too
    why = {r.rung: r for r in cpu_only.rejected}
    assert why[Rung.GPU_ONLY].reason.value == "no_gpu_backend"
    assert "without a GPU backend" in why[Rung.GPU_ONLY].detail
    # no rung that asks a GPU for a layer was priced (4bit needs a Q4 variant first)
    assert {r.rung: r.reason.value for r in cpu_only.rejected if r.rung is not Rung.FOUR_BIT} == {
        Rung.GPU_ONLY: "no_gpu_backend",
        Rung.MOE_SPLIT: "no_gpu_backend",
    }
    partial = decide(
        snap, Ask("m", (model("m", 4 * GiB, on_gpus=False),), rungs=(Rung.MAX_RAM, Rung.MAX_GPU))
    )
    assert isinstance(partial, Refuse)  # asked for layers on a GPU alone: said, not faked
    assert {r.rung: r.reason.value for r in partial.rejected} == {
        Rung.MAX_RAM: "no_gpu_backend",
        Rung.MAX_GPU: "no_gpu_backend",
    }


def _ask(candidate: Candidate) -> Ask:
    return Ask("m", (candidate,))


def _binary(path: Path, devices: str | None) -> Path:
    """A llama-server stand-in: --help lists --list-devices when ``devices`` is given, and
    --list-devices answers with it."""
    flags = "--list-devices\n" if devices is not None else ""
    listing = f"printf '{devices}'" if devices is not None else "true"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'#!/bin/sh\ncase "$1" in\n  --list-devices) {listing} ;;\n'
        f"  *) cat <<'EOF'\n{HELP}{flags}EOF\necho '{SYSTEM_INFO}' >&2 ;;\nesac\n"
    )
    os.chmod(path, 0o755)
    return path


def test_llama_servers_gpu_backend_is_read_from_its_device_list(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    real = inspect(llama_server_bin)  # this box's build: no GPU backend
    assert real.devices == () and not real.on_gpus
    assert LlamaServer(str(llama_server_bin.parent)).abilities().gpus is False

    cuda = inspect(
        _binary(
            tmp_path / "cuda" / "llama-server",
            "Available devices:\\n  CUDA0: NVIDIA H200 (143167 MiB, 1 MiB free)\\n",
        )
    )
    assert cuda.devices == ("CUDA",) and cuda.on_gpus
    blas = inspect(
        _binary(
            tmp_path / "blas" / "llama-server",
            "Available devices:\\n  BLAS: OpenBLAS (0 MiB, 0 MiB free)\\n",
        )
    )
    assert blas.devices == ("BLAS",) and not blas.on_gpus  # listed, but not a GPU
    old = inspect(_binary(tmp_path / "old" / "llama-server", None))
    assert old.devices is None and old.on_gpus  # not asked: assumed, as before the flag


class OneNvidiaGpu(GpuProbe):
    """NVML's answer on a box with one 24 GiB GPU (this machine has none: the driver is not
    real, the engine and the file are)."""

    def read(self) -> list[GpuReading]:
        return [GpuReading(0, "GPU-test", "test GPU", 24 * GiB, 24 * GiB, False)]


def _box(tmp_path: Path, gpus: GpuProbe, binary: Path) -> Box:
    models = tmp_path / "models"
    models.mkdir(parents=True, exist_ok=True)
    write_tiny_llama(models / "tiny.gguf")
    config = settings.load({"home": str(tmp_path / "home"), "models": str(models)}, env={})
    catalog = Catalog(config.models, config.aliases, config.facts_cache)
    return Box(config, catalog, gpus, None, [], EngineKinds([LlamaServer(str(binary.parent))]))


def test_the_box_places_a_cpu_only_engine_in_ram_beside_a_real_gpu_and_a_simulated_one_on_it(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    beside_gpu = _box(tmp_path / "nvml", OneNvidiaGpu(), llama_server_bin).plan_for("tiny")
    assert (beside_gpu["decision"], beside_gpu["rung"]) == ("place", "ram-only"), beside_gpu
    assert beside_gpu["gpu_layers"] == 0
    reasons = {r["rung"]: r["reason"] for r in beside_gpu["rejected"]}
    assert reasons["gpu-only"] == "no_gpu_backend"
    assert [d["simulated"] for d in beside_gpu["box"]] == [False, False]

    declared = _box(tmp_path / "sim", SimulatedGpus("24GiB"), llama_server_bin).plan_for("tiny")
    assert (declared["decision"], declared["rung"]) == ("place", "gpu-only"), declared
    assert declared["box"][0]["simulated"] is True  # labelled: the GPU paths run simulated

"""GPUs: read through NVML, or declared with FITBOX_SIMULATED_GPUS on a box without one.

A simulated inventory is plainly labelled: every reading carries ``simulated=True`` and the
name says "simulated". The rest of fitbox takes the same path for both.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fitbox.units import parse_size

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuReading:
    index: int
    uuid: str
    name: str
    total: int
    free: int
    simulated: bool


class GpuProbe:
    # whether a read may block: NVML asks the driver, which can stall for seconds on a GPU
    # in trouble, so its reads run off the event loop (box/sensors.py)
    blocking = False

    def read(self) -> list[GpuReading]:
        raise NotImplementedError

    def processes(self) -> dict[str, dict[int, int]]:
        """{"gpu0": {pid: bytes used}} of the compute processes on each GPU (none known)."""
        return {}


class SimulatedGpus(GpuProbe):
    """A declared inventory such as ``24GiB,24GiB``. Free memory is what fitbox leaves."""

    def __init__(self, spec: str) -> None:
        try:
            self.totals = [parse_size(part) for part in spec.split(",") if part.strip()]
        except ValueError as exc:
            raise ValueError(f"FITBOX_SIMULATED_GPUS={spec!r}: {exc}") from None

    def read(self) -> list[GpuReading]:
        return [
            GpuReading(i, f"SIMULATED-GPU-{i}", f"simulated GPU {i}", total, total, True)
            for i, total in enumerate(self.totals)
        ]


class NvmlGpus(GpuProbe):
    blocking = True

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()

    def read(self) -> list[GpuReading]:
        nvml = self._nvml
        readings = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            readings.append(
                GpuReading(
                    index=i,
                    uuid=str(nvml.nvmlDeviceGetUUID(handle)),
                    name=str(nvml.nvmlDeviceGetName(handle)),
                    total=int(memory.total),
                    free=int(memory.free),
                    simulated=False,
                )
            )
        return readings

    def processes(self) -> dict[str, dict[int, int]]:
        nvml = self._nvml
        found: dict[str, dict[int, int]] = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError:
                continue  # not supported on this device or driver: nothing to report
            found[f"gpu{i}"] = {int(p.pid): int(p.usedGpuMemory or 0) for p in running}
        return found


class NoGpus(GpuProbe):
    def read(self) -> list[GpuReading]:
        return []


def open_gpu_probe(simulated_spec: str) -> GpuProbe:
    if simulated_spec:
        return SimulatedGpus(simulated_spec)
    try:
        return NvmlGpus()
    except Exception as exc:  # no driver, no library, no device: a CPU box
        log.info("no NVML GPUs (%s); placing on host RAM", type(exc).__name__)
        return NoGpus()

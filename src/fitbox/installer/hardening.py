"""The sandbox of a system unit (fitbox.service, fitbox-central.service), with the reason
for each exposure left open written into the unit beside it. `systemd-analyze security
--offline=true` rates fitbox.service OK (tests/test_unit_security.py holds it there).

What the service needs and keeps: its children (llama-server, the transformers engine)
launched and pinned to CPUs, GPUs through their device nodes and NVML, its state, cache and
models writable, a listening socket and outgoing HTTP (a central, an update index)."""

from __future__ import annotations

# Device groups (/proc/devices) a GPU's engine opens: NVIDIA's /dev/nvidia0.., nvidiactl
# and nvidia-modeset (nvidia-frontend), nvidia-uvm (CUDA's unified memory), nvidia-caps
# (MIG); DRM render nodes (Vulkan builds) and AMD's kfd (ROCm).
GPU_DEVICES = (
    "char-nvidia-frontend",
    "char-nvidia-uvm",
    "char-nvidia-caps",
    "char-drm",
    "char-kfd",
)


def _comment(text: str) -> list[str]:
    return [f"# {line}" for line in text.strip().splitlines()]


# every system unit's: the [Service] lines after User=/Group=, the devices apart (sandbox)
SANDBOX = (
    "UMask=0027",
    *_comment("""
UMask 0027, files group-readable (exposure 0.1): the fitbox group shares the model store,
so a model fitbox pulls stays readable to those who add models (the home itself is 0710)
"""),
    "CapabilityBoundingSet=",
    "AmbientCapabilities=",
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    *_comment("""
ProtectHome read-only, not hidden (0.1): FITBOX_MODELS may name models kept in a home
"""),
    "ProtectHome=read-only",
    "PrivateTmp=yes",
    "PrivateMounts=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "ProtectProc=invisible",
    *_comment("""
ProcSubset: all of /proc, not pid (0.1): host RAM, swap, load and CPUs come from
/proc/meminfo, /proc/stat, /proc/loadavg, and NVML reads /proc/driver/nvidia
"""),
    "RestrictSUIDSGID=yes",
    "RestrictRealtime=yes",
    "RestrictNamespaces=yes",
    "LockPersonality=yes",
    "RemoveIPC=yes",
    "SystemCallArchitectures=native",
    *_comment("""
RootDirectory: the host's (0.1): the service runs fitbox's venv and the engines where
they were installed; ProtectSystem=strict makes all of it read-only
"""),
    *_comment("""
MemoryDenyWriteExecute: no (0.1): CUDA's driver compiles PTX for a GPU newer than the
engine's build into executable memory, and the engines inherit the unit's filter
"""),
    *_comment("""
RestrictAddressFamilies: AF_UNIX (0.1), as asyncio's event loop wakes itself through a
Unix socketpair; AF_INET and AF_INET6 (0.3): the network, below
"""),
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
    *_comment("""
PrivateNetwork and IPAddressDeny: no (0.5, 0.2): it is a server on the network, for the
addresses its trusted networks and keys admit, and calls a central or a package index
"""),
    *_comment("""
SystemCallFilter keeps @resources (0.2): fitbox raises its open-file limit (setrlimit)
and pins engines to the CPUs it claims (sched_setaffinity), llama-server places memory by
NUMA node (mbind, set_mempolicy); a call outside the list fails with EPERM, not a kill
"""),
    "SystemCallFilter=@system-service",
    "SystemCallFilter=~@privileged",
    "SystemCallErrorNumber=EPERM",
    *_comment("""
PrivateUsers: no (0.2): a GPU's device nodes are often group-owned (video, render, set
by the driver's options), reached through the fitbox user's supplementary groups, which a
user namespace holding only fitbox and root cannot map
"""),
    "DevicePolicy=closed",
)


def sandbox(gpus: bool) -> list[str]:
    """SANDBOX and the devices: ``gpus``, the box's (its engines open GPU device nodes),
    else the central's (no device at all)."""
    lines = list(SANDBOX)
    if gpus:
        lines += _comment("""
DeviceAllow: GPU device nodes only (0.1; ProtectClock adds char-rtc, read-only), so not
PrivateDevices (0.2: a private /dev has none of them); without these the closed list would
hide /dev/nvidia* from NVML and the engines. nvidia-uvm must be loaded before the
service starts (nvidia-persistenced, or modprobe at boot): NoNewPrivileges keeps CUDA's
setuid nvidia-modprobe from loading it
""")
        lines += [f"DeviceAllow={group} rw" for group in GPU_DEVICES]
    else:
        lines += _comment("DeviceAllow: char-rtc read-only alone (0.1), which ProtectClock adds")
        lines.append("PrivateDevices=yes")
    return lines

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


def sandbox(gpus: bool) -> list[str]:
    """The [Service] lines after User=/Group=; ``gpus``: the box (its engines open GPU
    device nodes), else the central (no device at all)."""
    lines = [
        "UMask=0027",
        *_comment("""
group-readable files (exposure 0.1): the fitbox group shares the model store, so a model
fitbox pulls stays readable to those who add models beside it (the home itself is 0710)
"""),
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        *_comment("""
home directories read-only, not hidden (0.1): FITBOX_MODELS may name models kept there
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
all of /proc, not ProcSubset=pid (0.1): host RAM, swap, load and CPUs come from
/proc/meminfo, /proc/stat, /proc/loadavg, and NVML reads /proc/driver/nvidia
"""),
        "RestrictSUIDSGID=yes",
        "RestrictRealtime=yes",
        "RestrictNamespaces=yes",
        "LockPersonality=yes",
        "RemoveIPC=yes",
        "SystemCallArchitectures=native",
        *_comment("""
the host's root directory (RootDirectory 0.1): the service runs fitbox's venv and the
engines where the package put them; ProtectSystem=strict makes all of it read-only
"""),
        *_comment("""
no MemoryDenyWriteExecute (0.1): CUDA's driver compiles PTX for a GPU newer than the
engine's build into executable memory, and the engines inherit the unit's filter
"""),
        *_comment("""
AF_UNIX (0.1): asyncio's event loop wakes itself through a Unix socketpair; AF_INET and
AF_INET6: the network, below
"""),
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        *_comment("""
the network, unfiltered (PrivateNetwork 0.5, IPAddressDeny 0.2): it is a server on it,
for the addresses its trusted networks and keys admit, and calls a central or an index
"""),
        *_comment("""
@resources stays allowed (0.2): fitbox raises its open-file limit (setrlimit) and pins
engines to the CPUs it claims (sched_setaffinity), llama-server places memory by NUMA node
(mbind, set_mempolicy); a call outside the list fails with EPERM rather than killing
"""),
        "SystemCallFilter=@system-service",
        "SystemCallFilter=~@privileged",
        "SystemCallErrorNumber=EPERM",
        *_comment("""
no PrivateUsers (0.2): a GPU's device nodes are often group-owned (video, render), and a
user namespace leaves such a group unmapped
"""),
        "DevicePolicy=closed",
    ]
    if gpus:
        lines += _comment("""
GPU device nodes only (DeviceAllow 0.1, PrivateDevices 0.2: a private /dev has none;
ProtectClock= adds char-rtc read-only): without these lines the closed allow-list would
hide /dev/nvidia* from NVML and the engines. nvidia-uvm must be loaded before the
service starts (nvidia-persistenced, or modprobe at boot): NoNewPrivileges keeps CUDA's
setuid nvidia-modprobe from loading it
""")
        lines += [f"DeviceAllow={group} rw" for group in GPU_DEVICES]
    else:
        lines.append("PrivateDevices=yes")
    return lines

"""What the core answers: Place, Wait or Refuse, each with its reasons and numbers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fitbox.core.repack import RepackReason
from fitbox.core.types import Footprint, Rung


class BandKind(StrEnum):
    RANGE = "range"  # any tick in [feasible_min, feasible_max] fits
    POINT = "point"  # exactly one window fits
    INFEASIBLE = "infeasible"  # none fits: refused, never loaded as a point


@dataclass(frozen=True)
class Band:
    kind: BandKind
    feasible_min: int
    feasible_max: int  # below feasible_min when infeasible


class VictimReason(StrEnum):
    LEAST_COST = "least_cost"  # the cheapest set (reload seconds x band) that frees enough


@dataclass(frozen=True)
class Victim:
    key: str
    bytes: int
    reason: VictimReason
    cost: float  # reload seconds x priority band


class RejectReason(StrEnum):
    NOT_MOE = "not_moe"
    NO_FOUR_BIT_VARIANT = "no_four_bit_variant"
    NO_GPU = "no_gpu"
    NO_GPU_BACKEND = "no_gpu_backend"  # the box has GPUs, its engine was built without one
    NEEDS_LAYOUT = "needs_layout"  # partial offload needs per-layer bytes
    NO_PARTIAL_OFFLOAD = "no_partial_offload"  # its engine loads a model whole, on one side
    KV_TYPE = "kv_type"
    WINDOW_INFEASIBLE = "window_infeasible"  # no window in the band fits the room
    BEYOND_TRAINING = "beyond_training"  # the call needs more than the model was trained on
    REFUSED_WINDOW = "refused_window"  # a measured failure caps the window below the need
    LARGER_THAN_BOX = "larger_than_box"  # even an empty device could not hold it
    HELD_BY_PINNED = "held_by_pinned"
    HELD_BY_BUSY = "held_by_busy"  # room exists once serving or loading residents settle
    NO_CORES = "no_cores"  # the CPU claim would get fewer than the floor of free cores
    NOT_CHOSEN = "not_chosen"  # admissible, but the goal ranked another first
    SMALLER_WINDOW = "smaller_window"  # fits, but another K/V type of the rung holds more


@dataclass(frozen=True)
class Rejected:
    artifact: str
    rung: Rung
    kv: str  # "f16/f16"
    reason: RejectReason
    detail: str


class CountReason(StrEnum):
    """Why a device count was or was not the one placed (FORMULAS.md §Multi-GPU)."""

    CHOSEN = "chosen"
    SMALLER_WINDOW = "smaller_window"  # its best set holds less of the window than the chosen
    MORE_DEVICES = "more_devices"  # the same window on more devices: the fewest win
    NO_WINDOW = "no_window"  # no set of this many GPUs holds the smallest window the call needs


@dataclass(frozen=True)
class DeviceCount:
    """The best set of ``count`` GPUs for a placement: the window it holds (0: none)."""

    count: int
    gpus: tuple[str, ...]
    window: int
    victims: tuple[str, ...]  # who would leave for it at that window
    reason: CountReason


@dataclass(frozen=True)
class Place:
    artifact: str
    rung: Rung
    window: int
    type_k: str
    type_v: str
    devices: tuple[str, ...]  # every device it uses: GPUs in order, then host
    footprint: tuple[tuple[str, Footprint], ...]  # per device
    gpu_layers: int  # -ngl
    tensor_split: tuple[float, ...]  # -ts; empty on one GPU
    experts_in_ram: bool  # --cpu-moe
    victims: tuple[Victim, ...]  # in the order to stop them
    cores: tuple[int, ...] = ()  # the CPU claim
    cores_from: tuple[str, ...] = ()  # idle residents whose cores the claim takes
    band: Band | None = None
    rejected: tuple[Rejected, ...] = ()
    predicted_seconds: float | None = None  # T, from measured rates only
    where: str = ""  # its placement class: what its measured facts are filed under
    device_counts: tuple[DeviceCount, ...] = ()  # a GPU rung on a multi-GPU box: 1, 2, ... GPUs
    repack: RepackReason = RepackReason.NONE  # ram_bound: launched with --no-repack
    slots: int = 1  # -np: calls it serves at once (core/slots.py)
    kv_unified: bool = False  # --kv-unified: every slot may fill the whole window
    load_in_4bit: bool = False  # the engine quantizes the artifact to 4-bit as it loads

    @property
    def no_repack(self) -> bool:
        return self.repack is RepackReason.RAM_BOUND

    @property
    def device(self) -> str:
        """Where most of it lives: its first GPU, else the host."""
        return self.devices[0]

    def bytes_on(self, device: str) -> int:
        return sum(f.total for d, f in self.footprint if d == device)


class WaitReason(StrEnum):
    BUSY_RESIDENTS = "busy_residents"  # room exists once these finish their calls
    BETTER_SOON = "better_soon"  # a better placement frees up within the call's max wait


@dataclass(frozen=True)
class Wait:
    reason: WaitReason
    blockers: tuple[str, ...]
    needed: int
    available: int  # the most any device could offer now, evicting every idle resident
    bound: float  # seconds: the call's max wait, or the expected time to the change
    rejected: tuple[Rejected, ...] = ()


class RefuseReason(StrEnum):
    LARGER_THAN_BOX = "larger_than_box"  # even an empty box could not hold it
    HELD_BY_PINNED = "held_by_pinned"  # only pinned residents could make room
    CONTEXT = "context"  # the call needs a window no placement can give
    NO_CORES = "no_cores"  # memory fits but the CPU floor cannot be met
    BAD_ARTIFACT = "bad_artifact"  # terminal: never answered with another quant
    NO_CANDIDATE = "no_candidate"  # pins or settings leave nothing to try


@dataclass(frozen=True)
class Refuse:
    reason: RefuseReason
    needed: int
    available: int
    holders: tuple[str, ...] = ()  # held_by_pinned: the pinned residents in the way
    device: str = ""  # the device the numbers are about
    detail: str = ""
    rejected: tuple[Rejected, ...] = ()
    footprint: Footprint | None = None  # what ``needed`` is made of, on ``device``
    window: int = 0  # the window ``needed`` was priced at (the smallest the call allows)


Decision = Place | Wait | Refuse

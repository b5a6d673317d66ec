"""Parse the memory lines of a llama-server log into frozen dataclasses.

Launch the server with ``-lv 4``: libllama's buffer sizes are logged at TRACE (see
shared/reference/llama-server.md §3). :func:`parse_load_log` accepts lines with or without
the ``M.SS.mmm.uuu L`` prefix, with or without ANSI colours, and any buffer name (``CPU``,
``CPU_Mapped``, ``CPU_REPACK``, ``CUDA0``, ``CUDA_Host``, ``Vulkan0``, ``ROCm0``, …). Lines it
does not know are ignored, and it never raises.

Units. llama.cpp prints buffer sizes in MiB with two decimals (``%8.2f``); they are turned
into bytes with ``round(mib * 1024 * 1024)``, so every byte figure here is exact only to
±0.005 MiB (±5243 bytes). The memory breakdown table prints whole MiB, floored by the
engine, so its figures are ``n * 1024 * 1024`` and may be up to 1 MiB below the truth.

Which lines count. Buffer lines are summed per buffer name (an iSWA model logs two KV
caches; a draft model adds its own buffers). Lines at level ``D`` are skipped: at ``-v``,
``--fit``'s probe loads replay the buffer lines at DEBUG. Single values (``n_ctx`` …,
``n_slots``) keep the first occurrence, which is the main model's context. The breakdown
keeps only the last table: ``--fit`` prints a projected one, shutdown prints the real one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 1024 * 1024

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PREFIX = re.compile(r"^\s*(?:\d{1,6}\.\d{2}\.\d{3}\.\d{3} )?([IWED]) ")
_F = r"(\d{1,12}(?:\.\d{1,6})?)"  # a MiB figure; bounded so float() and round() cannot fail
_N = r"(\d{1,15})"
_T = r"([^()\s]{1,32})"  # a ggml type name: f16, q8_0, bf16, …
_TAG = r"^(?:[a-z]{2,5}\s+)?"  # an optional module tag, as server lines carry ("srv  ")

_MODEL_BUF = re.compile(_TAG + r"load_tensors:\s+(\S+) model buffer size =\s+" + _F + " MiB")
# a --mmproj projector (tools/mtmd/clip.cpp): its weights, filed as the "mmproj" model buffer
_PROJ_SIZE = re.compile(_TAG + r"load_hparams: model size:\s+" + _F + " MiB")
_OFFLOADED = re.compile(_TAG + r"load_tensors: offloaded " + _N + "/" + _N + " layers to GPU")
_KV_BUF = re.compile(_TAG + r"llama_kv_cache\w*:\s+(\S+) KV buffer size =\s+" + _F + " MiB")
_KV_NEW = re.compile(_TAG + r"llama_\w+: creating\s+(.{1,16}?) KV cache, size = \d+ cells")
_KV_SIZE = re.compile(
    _TAG
    + r"llama_kv_cache\w*: size =\s+"
    + _F
    + r" MiB \(\s*"
    + _N
    + r" cells,\s+"
    + _N
    + r" layers,\s+"
    + _N
    + r"(?:/"
    + _N
    + r")? seqs\), K \("
    + _T
    + r"\):\s+"
    + _F
    + r" MiB, V \("
    + _T
    + r"\):\s+"
    + _F
    + " MiB"
)
_RS_BUF = re.compile(_TAG + r"llama_\w+:\s+(\S+) RS buffer size =\s+" + _F + " MiB")
_RS_SIZE = re.compile(
    _TAG
    + r"llama_memory_recurrent\w*: size =\s+"
    + _F
    + r" MiB \(\s*"
    + _N
    + r" cells,\s+"
    + _N
    + r" layers,\s+"
    + _N
    + r" seqs(?:\s+"
    + _N
    + r" rs_seq)?\), R \("
    + _T
    + r"\):\s+"
    + _F
    + r" MiB, S \("
    + _T
    + r"\):\s+"
    + _F
    + r" MiB(?:, P \("
    + _T
    + r"\):\s+"
    + _F
    + " MiB)?"
)
_OUTPUT_BUF = re.compile(_TAG + r"llama_context:\s+(\S+)\s+output buffer size =\s+" + _F + " MiB")
_COMPUTE_BUF = re.compile(_TAG + r"\w+:\s+(\S+) compute buffer size =\s+" + _F + " MiB")
_CTX_INT = re.compile(
    _TAG
    + r"llama_context: (n_ctx|n_ctx_seq|n_ctx_per_seq|n_seq_max|n_batch|n_ubatch)\s+= "
    + _N
    + r"\s*$"
)
_CTX_STR = re.compile(_TAG + r"llama_context: (flash_attn|kv_unified)\s+= (\S{1,16})\s*$")
_SLOTS = re.compile(
    r"initializing, n_slots = " + _N + ", n_ctx_slot = " + _N + r"(?:, kv_unified = '(\w+)')?"
)
_BD_HEAD = re.compile(_TAG + r"\w*memory_breakdown\w*: \| memory breakdown \[MiB\]")
_BD_ROW = re.compile(_TAG + r"\w*memory_breakdown\w*: \|\s*- ([^|]{1,200}?)\s*\|([^|]*)\|\s*$")
_BD_DEV = re.compile(r"^(\S+) \((.*)\)$")
_I = r"\s*(-?\d{1,15})\s*"
_BD_GPU = re.compile(f"^{_I}={_I}\\+\\s*\\({_I}={_I}\\+{_I}\\+{_I}\\)\\s*\\+{_I}$")
_BD_HOST = re.compile(f"^{_I}={_I}\\+{_I}\\+{_I}$")
_FATAL = re.compile(
    r"failed to|exiting due to|error loading model|GGML_ASSERT|terminate called|^error:"
)


@dataclass(frozen=True)
class KVCacheLine:
    """One ``llama_kv_cache: size = …`` line. ``cells`` is per stream; ``seqs`` is
    ``n_seq_max`` and ``streams`` ``n_stream`` (1 when unified, or when an older engine
    printed no ``/n``). ``kind`` is ``full`` or ``swa`` after an iSWA ``creating … KV
    cache`` line (``indexer`` and the like likewise), else ``unified``."""

    total_bytes: int
    cells: int
    layers: int
    seqs: int
    streams: int
    type_k: str
    k_bytes: int
    type_v: str
    v_bytes: int
    kind: str


@dataclass(frozen=True)
class RecurrentLine:
    """One ``llama_memory_recurrent: size = …`` line. This engine also prints the rollback
    snapshot count (``rs_seq``) and a ``P`` part (PLE history); both are None when absent."""

    total_bytes: int
    cells: int
    layers: int
    seqs: int
    type_r: str
    r_bytes: int
    type_s: str
    s_bytes: int
    rs_seq: int | None
    type_p: str | None
    p_bytes: int | None


@dataclass(frozen=True)
class BreakdownRow:
    """A row of ``common_memory_breakdown_print``, whole MiB turned into bytes; None where
    the table leaves a cell blank (Host has no total, free or unaccounted). ``device`` is
    ``Host``, a device name (``CUDA0``) or a buffer type; ``description`` is the text in
    parentheses after a device name (``RTX 4090``)."""

    device: str
    description: str | None
    total: int | None
    free: int | None
    self_: int | None
    model: int | None
    context: int | None
    compute: int | None
    unaccounted: int | None


@dataclass(frozen=True)
class LoadReport:
    model_buffers: dict[str, int]
    kv_buffers: dict[str, int]
    kv_caches: tuple[KVCacheLine, ...]
    recurrent_buffers: dict[str, int]
    recurrent: tuple[RecurrentLine, ...]
    compute_buffers: dict[str, int]
    output_buffers: dict[str, int]
    n_ctx: int | None
    n_ctx_seq: int | None
    n_seq_max: int | None
    n_batch: int | None
    n_ubatch: int | None
    flash_attn: str | None
    kv_unified: bool | None
    offloaded_layers: tuple[int, int] | None
    n_slots: int | None
    n_ctx_slot: int | None
    breakdown: tuple[BreakdownRow, ...]
    errors: tuple[str, ...]

    def bytes_by_kind(self) -> dict[str, int]:
        """Total bytes per kind of buffer, over every buffer name."""
        return {
            "model": sum(self.model_buffers.values()),
            "kv": sum(self.kv_buffers.values()),
            "recurrent": sum(self.recurrent_buffers.values()),
            "compute": sum(self.compute_buffers.values()),
            "output": sum(self.output_buffers.values()),
        }


def _b(mib: str) -> int:
    return round(float(mib) * MIB)


def _add(buffers: dict[str, int], name: str, mib: str) -> None:
    buffers[name] = buffers.get(name, 0) + _b(mib)


def _strip(raw: str) -> tuple[str | None, str]:
    """(level letter or None, message) of one raw line."""
    line = _ANSI.sub("", raw).replace("\r", "").rstrip()
    m = _PREFIX.match(line)
    if m is None:
        return None, line.strip()
    return m.group(1), line[m.end() :].strip()


def _kv(m: re.Match[str], kind: str) -> KVCacheLine:
    g = m.groups()
    streams = 1 if g[4] is None else int(g[4])
    return KVCacheLine(
        _b(g[0]), int(g[1]), int(g[2]), int(g[3]), streams, g[5], _b(g[6]), g[7], _b(g[8]), kind
    )


def _rs(m: re.Match[str]) -> RecurrentLine:
    g = m.groups()
    return RecurrentLine(
        _b(g[0]),
        int(g[1]),
        int(g[2]),
        int(g[3]),
        g[5],
        _b(g[6]),
        g[7],
        _b(g[8]),
        None if g[4] is None else int(g[4]),
        g[9],
        None if g[10] is None else _b(g[10]),
    )


def _row(label: str, body: str) -> BreakdownRow | None:
    dm = _BD_DEV.match(label)
    device, desc = (dm.group(1), dm.group(2)) if dm else (label, None)
    if (g := _BD_GPU.match(body)) is not None:
        t, f, s, mo, c, co, u = (int(x) * MIB for x in g.groups())
        return BreakdownRow(device, desc, t, f, s, mo, c, co, u)
    if (h := _BD_HOST.match(body)) is not None:
        s, mo, c, co = (int(x) * MIB for x in h.groups())
        return BreakdownRow(device, desc, None, None, s, mo, c, co, None)
    return None


def parse_load_log(text: str) -> LoadReport:
    """Parse a whole llama-server log (stderr and stdout together). Never raises."""
    reading = _Reading()
    for raw in str(text).split("\n"):
        try:
            reading.line(raw)
        except (ValueError, OverflowError):  # pragma: no cover - the patterns bound every number
            continue
    return reading.report()


@dataclass
class _Reading:
    """What the lines read so far said; each ``_take_*`` owns a group of patterns and tries
    them in the order the log's meaning needs (the first that matches a line wins)."""

    buffers: dict[str, dict[str, int]] = field(
        default_factory=lambda: {k: {} for k in ("model", "kv", "rs", "compute", "out")}
    )
    kv_caches: list[KVCacheLine] = field(default_factory=list)
    recurrent: list[RecurrentLine] = field(default_factory=list)
    ints: dict[str, int] = field(default_factory=dict)
    strs: dict[str, str] = field(default_factory=dict)
    offloaded: tuple[int, int] | None = None
    breakdown: list[BreakdownRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pending_kind: str | None = None  # the KV cache a "creating ... KV cache" line announced

    def line(self, raw: str) -> None:
        level, msg = _strip(raw)
        if level == "E" or (level is None and _FATAL.search(msg)):
            self.errors.append(msg)
        if level == "D" or not msg:
            return
        for take in (self._take_memory, self._take_context, self._take_breakdown):
            if take(msg):
                return

    def _take_memory(self, msg: str) -> bool:
        """Buffer sizes and the KV and recurrent cache lines."""
        if m := _MODEL_BUF.match(msg):
            _add(self.buffers["model"], m.group(1), m.group(2))
        elif m := _PROJ_SIZE.match(msg):
            _add(self.buffers["model"], "mmproj", m.group(1))
        elif m := _KV_BUF.match(msg):
            _add(self.buffers["kv"], m.group(1), m.group(2))
        elif m := _KV_SIZE.match(msg):
            self.kv_caches.append(_kv(m, self.pending_kind or "unified"))
            self.pending_kind = None
        elif m := _KV_NEW.match(msg):
            name = m.group(1).strip()
            self.pending_kind = {"non-SWA": "full", "SWA": "swa"}.get(name, name.lower())
        elif m := _RS_BUF.match(msg):
            _add(self.buffers["rs"], m.group(1), m.group(2))
        elif m := _RS_SIZE.match(msg):
            self.recurrent.append(_rs(m))
        elif m := _OUTPUT_BUF.match(msg):
            _add(self.buffers["out"], m.group(1), m.group(2))
        elif m := _COMPUTE_BUF.match(msg):
            _add(self.buffers["compute"], m.group(1), m.group(2))
        else:
            return False
        return True

    def _take_context(self, msg: str) -> bool:
        """The context's single values, the offload count and the server's slots."""
        if m := _CTX_INT.match(msg):
            key = "n_ctx_seq" if m.group(1) == "n_ctx_per_seq" else m.group(1)
            self.ints.setdefault(key, int(m.group(2)))
        elif m := _CTX_STR.match(msg):
            self.strs.setdefault(m.group(1), m.group(2))
        elif m := _OFFLOADED.match(msg):
            self.offloaded = self.offloaded or (int(m.group(1)), int(m.group(2)))
        elif m := _SLOTS.search(msg):
            self.ints.setdefault("n_slots", int(m.group(1)))
            self.ints.setdefault("n_ctx_slot", int(m.group(2)))
            if m.group(3):  # at default verbosity this is the only kv_unified line
                self.strs.setdefault("kv_unified", m.group(3))
        else:
            return False
        return True

    def _take_breakdown(self, msg: str) -> bool:
        """The memory breakdown table: a new header starts it over (only the last counts)."""
        if _BD_HEAD.match(msg):
            self.breakdown = []
        elif m := _BD_ROW.match(msg):
            row = _row(m.group(1).strip(), m.group(2))
            if row is not None:
                self.breakdown.append(row)
        else:
            return False
        return True

    def report(self) -> LoadReport:
        ints, strs, unified = self.ints, self.strs, self.strs.get("kv_unified")
        return LoadReport(
            model_buffers=self.buffers["model"],
            kv_buffers=self.buffers["kv"],
            kv_caches=tuple(self.kv_caches),
            recurrent_buffers=self.buffers["rs"],
            recurrent=tuple(self.recurrent),
            compute_buffers=self.buffers["compute"],
            output_buffers=self.buffers["out"],
            n_ctx=ints.get("n_ctx"),
            n_ctx_seq=ints.get("n_ctx_seq"),
            n_seq_max=ints.get("n_seq_max"),
            n_batch=ints.get("n_batch"),
            n_ubatch=ints.get("n_ubatch"),
            flash_attn=strs.get("flash_attn"),
            kv_unified=None if unified not in ("true", "false") else unified == "true",
            offloaded_layers=self.offloaded,
            n_slots=ints.get("n_slots"),
            n_ctx_slot=ints.get("n_ctx_slot"),
            breakdown=tuple(self.breakdown),
            errors=tuple(self.errors),
        )

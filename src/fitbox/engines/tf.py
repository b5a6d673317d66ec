"""The transformers engine: an engine interpreter found (or built), and children run in it.

fitbox's own venv never imports torch. The engine is another interpreter, accepted only
after a subprocess probe has imported its modules there; discovery order:
``FITBOX_TF_PYTHON``, ``<engine dir>/tf`` (what ``fitbox install --tf`` builds), the active
``VIRTUAL_ENV`` / ``CONDA_PREFIX``, then conventional places (``~/.venvs/*``,
``~/venvs/*``, ``~/miniconda3/envs/*``, ``~/anaconda3/envs/*``, ``/opt/conda/envs/*``).
Each child is ``<python> -c BOOT <engines folder> --model DIR …``: the folder holding
``tf_child`` goes at the *end* of the child's ``sys.path``, so nothing of fitbox shadows the
engine's own packages.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from fitbox.core.repack import CpuFeatures
from fitbox.engines.child import Child
from fitbox.engines.http1 import EngineConnectionError, EnginePool
from fitbox.engines.llama_server import parse_timings
from fitbox.engines.seam import (
    Abilities,
    CallTimings,
    EngineNotFound,
    Held,
    LaunchIntent,
    LaunchSpec,
)
from fitbox.errors import FitboxError

NAME = "transformers"
ROUTES = frozenset({"/v1/chat/completions", "/v1/embeddings"})
INSTALL_COMMAND = "fitbox install --tf"
PROBE_S = 180  # importing torch and transformers cold: ~5-15 s alone, minutes on a busy box
# The probe imports what every child imports and what decides a rung (bitsandbytes: the
# 4bit rung, on CUDA or on the CPU), and only looks for the rest (an import of peft or
# sentence-transformers costs seconds more and is needed by some folders only); ``full``
# (fitbox engines) imports every one, so a package that is there but broken is named.
# It also lists what the engine's transformers loads (its model classes and config
# types): the catalog judges folders by it (models/folder_judge.py).
PROBE = """
import importlib, importlib.util, json, sys
full = sys.argv[1:] == ["full"]
found, failed = {}, {}
for name in ("torch", "transformers", "safetensors", "bitsandbytes", "PIL",
             "accelerate", "peft", "sentence_transformers"):
    if not full and name in ("accelerate", "peft", "sentence_transformers"):
        found[name] = "present" if importlib.util.find_spec(name) else None
        continue
    try:
        found[name] = str(getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:
        found[name] = None
        if importlib.util.find_spec(name) is not None:
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
cuda = False
try:
    import torch
    cuda = torch.cuda.is_available()
except Exception:
    pass
support = None
try:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    support = {
        "transformers": transformers.__version__,
        "architectures": sorted(n for n in dir(transformers)
                                if n[:1].isupper() and ("For" in n or n.endswith("Model"))),
        "model_types": sorted(CONFIG_MAPPING_NAMES),
    }
except Exception:
    pass
print(json.dumps({"modules": found, "failed": failed, "four_bit": bool(found["bitsandbytes"]),
                  "cuda": cuda, "support": support}))
"""
NEEDED = ("torch", "transformers", "safetensors")
BOOT = (
    "import sys; sys.path.append(sys.argv[1]); "
    "from tf_child.__main__ import main; main(sys.argv[2:])"
)
COUNT = "/v1/chat/completions/count"  # tf_child/__main__.py
_OOM = ("CUDA out of memory", "OutOfMemoryError", "DefaultCPUAllocator: can't allocate memory")


@dataclass(frozen=True)
class Candidate:
    python: Path
    source: str  # which rule of the discovery order found it


@dataclass(frozen=True)
class Probe:
    """What an interpreter said when it imported the engine's modules (or why it could not)."""

    python: Path
    modules: dict[str, str | None]
    four_bit: bool  # bitsandbytes imports: the 4bit rung loads, on CUDA or on the CPU
    cuda: bool
    problem: str | None = None  # None: it can run a child
    failed: dict[str, str] = field(default_factory=dict)  # a module there that fails to import
    support: dict[str, object] | None = None  # what its transformers loads (folder_judge.py)

    @property
    def usable(self) -> bool:
        return self.problem is None

    def four_bit_problem(self) -> str | None:
        """Why the 4bit rung is not offered by this interpreter, or None when it is."""
        if self.four_bit:
            return None
        if "bitsandbytes" in self.failed:
            return f"bitsandbytes failed to import in {self.python}: {self.failed['bitsandbytes']}"
        return f"bitsandbytes is not in the engine environment ({self.python})"


def venv_dir(engine_dir: Path) -> Path:
    return engine_dir / "tf"


def _venv_python(root: Path) -> Path:
    return root / "bin" / "python"


def candidates(engine_dir: Path | None, env: dict[str, str] | None = None) -> list[Candidate]:
    """Every interpreter that might run the engine, in the order fitbox prefers them."""
    env = dict(os.environ) if env is None else env
    found: list[Candidate] = []
    if env.get("FITBOX_TF_PYTHON"):
        found.append(Candidate(Path(env["FITBOX_TF_PYTHON"]), "FITBOX_TF_PYTHON"))
    if engine_dir is not None:
        found.append(
            Candidate(_venv_python(venv_dir(engine_dir)), "engine dir (fitbox install --tf)")
        )
    for name in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if env.get(name):
            found.append(Candidate(_venv_python(Path(env[name])), name))
    home = Path(env.get("HOME", "~")).expanduser()
    for pattern in (
        home / ".venvs/*",
        home / "venvs/*",
        home / "miniconda3/envs/*",
        home / "anaconda3/envs/*",
        Path("/opt/conda/envs/*"),
    ):
        for match in sorted(glob.glob(str(pattern))):
            found.append(Candidate(_venv_python(Path(match)), str(pattern.parent) + "/*"))
    unique: dict[Path, Candidate] = {}
    for candidate in found:
        unique.setdefault(candidate.python, candidate)
    return list(unique.values())


@lru_cache(maxsize=16)
def _probe(python: Path, mtime_ns: int, full: bool = False) -> Probe:
    try:
        run = subprocess.run(
            [str(python), "-c", PROBE, *(["full"] if full else [])],
            capture_output=True,
            text=True,
            timeout=PROBE_S,
            check=False,
            env=_child_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Probe(python, {}, False, False, f"did not run: {exc}")
    try:
        said = json.loads(run.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
        return Probe(python, {}, False, False, f"the import probe failed: {tail[0]}")
    modules = dict(said.get("modules", {}))
    missing = [m for m in NEEDED if not modules.get(m)]
    problem = f"cannot import {', '.join(missing)}" if missing else None
    failed = {str(k): str(v) for k, v in dict(said.get("failed") or {}).items()}
    support = said.get("support") if isinstance(said.get("support"), dict) else None
    four_bit, cuda = bool(said.get("four_bit")), bool(said.get("cuda"))
    return Probe(python, modules, four_bit, cuda, problem, failed, support)


def probe(python: Path, full: bool = False) -> Probe:
    """Import the engine's modules in ``python`` (once per interpreter file and mtime);
    ``full``: every module the engine may need is imported, not only looked for."""
    try:
        mtime = python.stat().st_mtime_ns
    except OSError as exc:
        return Probe(python, {}, False, False, f"not there: {exc.strerror}")
    return _probe(python, mtime, full)


def write_support(path: Path | None, found: Probe) -> None:
    """Record what the selected interpreter's transformers loads, for the catalog's scan
    (models/folder_judge.py; fitbox's own venv never imports transformers). Replaced
    whole, and only when it changed: a scan never reads half a file."""
    if path is None or found.support is None:
        return
    data = json.dumps({**found.support, "python": str(found.python)}, sort_keys=True)
    with contextlib.suppress(OSError):
        if path.read_text() == data:
            return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.{os.getpid()}")
        part.write_text(data)
        os.replace(part, path)
    except OSError:
        pass  # a home fitbox may not write: folders are judged without it


def _child_env() -> dict[str, str]:
    """The engine runs with its own packages only: fitbox's PYTHONPATH is not passed on."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.setdefault("HF_HUB_OFFLINE", "1")  # a child never fetches: the folder is the model
    env.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def select(engine_dir: Path | None, env: dict[str, str] | None = None) -> tuple[Probe, list[Probe]]:
    """The first usable interpreter, and every probe made to find it."""
    tried: list[Probe] = []
    for candidate in candidates(engine_dir, env):
        found = probe(candidate.python)
        tried.append(found)
        if found.usable:
            return found, tried
    looked = "; ".join(f"{p.python}: {p.problem}" for p in tried) or "no candidates"
    raise EngineNotFound(
        f"No Python environment with torch and transformers for the transformers engine "
        f"({looked}). Build one with '{INSTALL_COMMAND}', or point FITBOX_TF_PYTHON at an "
        f"interpreter that has them."
    )


def device_of(intent: LaunchIntent) -> str:
    """cpu for a placement in RAM, cuda for one on a GPU, accelerate's split for a part."""
    if not intent.gpu_layers or not intent.gpus:
        return "cpu"
    return "auto" if intent.tensor_split or intent.experts_in_ram else "cuda"


def build_argv(python: Path, intent: LaunchIntent, adapter: Path | None = None) -> list[str]:
    argv = [
        str(python),
        "-c",
        BOOT,
        str(Path(__file__).resolve().parent),
        "--model",
        str(intent.model_path),
        "--alias",
        intent.alias,
        "--host",
        intent.host,
        "--port",
        str(intent.port),
        "--window",
        str(intent.window),
        "--device",
        device_of(intent),
    ]
    if intent.threads:
        argv += ["--threads", str(intent.threads)]
    if intent.embedding:
        argv.append("--embedding")
    elif intent.vision:
        argv.append("--vision")  # a processor beside the tokenizer: image parts are read
    if adapter is not None:
        argv += ["--adapter", str(adapter)]
    if intent.load_in_4bit:
        argv.append("--load-in-4bit")
    if intent.experts_in_ram:
        argv.append("--experts-in-ram")
    return argv


def held_from_props(props: dict[str, object], kv_budget: int) -> Held | None:
    """Counted weights from a child's ``/props``; the KV is the window's budget (the cache
    grows as tokens arrive), the compute part what the process holds beyond its weights."""
    weights = props.get("weights")
    if not isinstance(weights, dict) or not isinstance(weights.get("total"), int):
        return None
    total = int(weights["total"])
    rss = props.get("rss_bytes_after_load")
    on_cpu = set(weights.get("by_device", {})) <= {"cpu"}
    overhead = max(int(rss) - total, 0) if on_cpu and isinstance(rss, int) else 0
    window = props.get("n_ctx")
    return Held(
        weights=total,
        kv=kv_budget,
        compute=overhead,
        output=0,
        n_ctx=window if isinstance(window, int) else None,
        n_ctx_seq=window if isinstance(window, int) else None,
        now=now_from_props(props, overhead),
    )


def now_from_props(props: dict[str, object], overhead: int) -> int | None:
    """What the child occupies now: its counted weights, the compute part of its load, and
    the KV its cache holds at this moment (``kv_bytes_now``; the cache grows per token and
    is let go after each call)."""
    weights, kv_now = props.get("weights"), props.get("kv_bytes_now")
    if not isinstance(weights, dict) or not isinstance(weights.get("total"), int):
        return None
    if not isinstance(kv_now, int):
        return None
    return int(weights["total"]) + overhead + kv_now


class Transformers:
    """Hugging Face model folders behind the engine seam (engines/seam.py)."""

    name = NAME

    def __init__(self, engine_dir: Path | None = None, support: Path | None = None) -> None:
        """``support``: where the selected interpreter's probe records what its
        transformers loads (models/folder_judge.py reads it at every scan)."""
        self.engine_dir, self.support = engine_dir, support
        self._probe: Probe | None = None
        self._probing: threading.Thread | None = None  # abilities() asks it once, off the loop
        # one probe at a time: a load's locate (a worker thread) and abilities()' probe
        # thread may ask at once, and each probe imports torch in a subprocess
        self._locating = threading.Lock()
        self._kv_budget: dict[int, int] = {}  # port -> the KV its window may grow to

    def serves(self, artifact_format: str) -> bool:
        return artifact_format == "transformers"

    def routes(self) -> frozenset[str]:
        return ROUTES

    def locate(self) -> None:
        if self._probe is not None:
            return
        with self._locating:
            if self._probe is None:
                self._probe, _ = select(self.engine_dir)
                write_support(self.support, self._probe)

    def unavailable(self) -> FitboxError | None:
        return None  # a missing engine is found at launch (locate): its fix is named there

    async def prepare(self) -> None:
        """Its probe (torch imported, up to minutes), in a thread: a decision to load a
        folder waits for it, as the load would (it runs the interpreter the probe
        selects), so the 4bit rung is judged by what the engine can do, not by a probe
        still running. Called for its own folders only (engines/kinds.py)."""
        if self._probe is None:
            await asyncio.to_thread(self._locate_quietly)

    def selected(self) -> Probe:
        self.locate()
        assert self._probe is not None
        return self._probe

    def cpu_features(self) -> CpuFeatures | None:
        return None  # torch keeps weights as loaded: nothing is repacked

    def abilities(self) -> Abilities:
        """4-bit when the selected interpreter imports bitsandbytes (its probe; it loads
        4-bit on CUDA and on the CPU); a folder loads whole, on a GPU or in RAM: the child
        has no per-layer offload."""
        if self._probe is None:  # a cold probe imports torch (up to minutes): never on the
            # event loop that asked. Until it answers, no 4-bit rung is offered (a whole load
            # still is), and the probe's answer is ready for the next decision.
            if self._probing is None:
                self._probing = threading.Thread(
                    target=self._locate_quietly, daemon=True, name="tf-probe"
                )
                self._probing.start()
            return Abilities(
                four_bit_in_place=False,
                four_bit_problem="the transformers engine's probe has not answered yet "
                "(it imports torch once); ask again in a moment",
                partial_offload=False,
            )
        # a CPU-only torch loads on no GPU, whatever the device map asks
        return Abilities(
            four_bit_in_place=self._probe.four_bit,
            four_bit_problem=self._probe.four_bit_problem() or "",
            partial_offload=False,
            gpus=self._probe.cuda,
        )

    def _locate_quietly(self) -> None:
        with contextlib.suppress(EngineNotFound):  # a call to the model says so, with the fix
            self.locate()

    def launch(self, intent: LaunchIntent) -> LaunchSpec:
        from fitbox.models.transformers_facts import adapter_of, kv_bytes, read_transformers_facts

        folder = Path(intent.model_path)
        facts = read_transformers_facts(folder)
        if facts.dtype == "float32":  # the cache is kept in the model's own dtype
            facts = read_transformers_facts(folder, kv_dtype_bytes=4)
        self._kv_budget[intent.port] = 0 if intent.embedding else kv_bytes(facts, intent.window)
        argv = build_argv(self.selected().python, intent, adapter_of(folder))
        env = _child_env()
        if device_of(intent) != "cpu":
            env |= {
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in intent.gpus),
            }
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""  # a placement in RAM touches no GPU
        return LaunchSpec(tuple(argv), intent.port, env)

    def slots(self, parallel: int) -> int:
        return 1  # one generation at a time; more calls wait at fitbox's door

    def slots_for(self, n: int) -> int:
        return 1  # its n choices are rows of one batch, in the one call (tf_child/chat.py)

    async def held(self, child: Child) -> Held | None:
        props = await self._props(child)
        if props is None:
            return None
        return held_from_props(props, self._kv_budget.pop(child.port, 0))

    async def held_now(self, child: Child) -> int | None:
        props = await self._props(child)
        if props is None:
            return None
        held = held_from_props(props, 0)
        return held.now if held is not None else None

    async def _props(self, child: Child) -> dict[str, object] | None:
        try:
            status, body = await child.pool.get("/props")
            props = json.loads(body) if status == 200 else None
        except (EngineConnectionError, OSError, json.JSONDecodeError):
            return None
        return props if isinstance(props, dict) else None

    def timings(self, tail: bytes) -> CallTimings | None:
        return parse_timings(tail)  # the child writes llama-server's ``timings`` object

    def out_of_memory(self, lines: Sequence[str]) -> str | None:
        return next((ln for ln in reversed(lines) if any(s in ln for s in _OOM)), None)

    def shape(self, path: str, body: bytes) -> tuple[str, bytes]:
        return path, body  # the child speaks the OpenAI shapes

    async def count_prompt(self, pool: EnginePool, path: str, body: bytes) -> int | None:
        """A chat prompt's tokens by the child's own template and tokenizer (it answers
        while a call runs: a long prompt is placed by its count, not reloaded for its byte
        bound); None for another route, or a vision folder (its images are not counted)."""
        if path != "/v1/chat/completions":
            return None
        headers = {"Content-Type": "application/json"}
        response = await pool.request("POST", COUNT, body, headers)
        try:
            content = await response.read()
        finally:
            response.close()
        try:
            tokens = json.loads(content).get("input_tokens") if response.status == 200 else None
        except (json.JSONDecodeError, AttributeError):
            return None
        return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None

    def sends_on_bound(self, path: str) -> bool:
        return False  # the child refuses a long prompt without its count (tf_child/chat.py)

    def refused_prompt(self, status: int, body: bytes) -> int | None:
        return None

    def metrics_path(self) -> str | None:
        return None  # the child serves no Prometheus figures of its own (yet)

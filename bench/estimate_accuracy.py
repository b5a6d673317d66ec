"""Estimate accuracy: fitbox's footprint from file headers against what llama-server really
allocated, per model, window, slots, K/V type and flash attention, per buffer kind.

    python bench/estimate_accuracy.py [--quick] [--only quants|zoo|tf]

Models: SmolLM2-135M (llama), the tiny GGUF zoo written with gguf (GQA with per-layer KV
heads, sliding-window layers, MoE, two hybrids), and every quant type the bundled
llama-quantize writes without an importance matrix (tests/support/quants.py), each loaded by the
real engine on this CPU, with its repack rule. Prints every row, the worst error per kind,
and whether each kind meets its target (weights and KV within 1 MiB, compute within 2 %,
total within 1 %).

``tf`` rows: the transformers engine (its venv built as the tests build it,
tests/support/tf_engine.py): SmolLM2 as float32 and bfloat16 safetensors folders and all-
MiniLM-L6-v2, each loaded by a real child on the CPU (the ram-only rung); the safetensors
header's weights against the child's counted weights (``/props``: params + buffers, tied
tensors once). The 4-bit row loads the float32 folder with ``--load-in-4bit`` and compares
``four_bit_weights`` (FORMULAS.md §4-bit in place) with what the child counted (its
bitsandbytes scales too). The test venv leaves bitsandbytes out; recent bitsandbytes (0.48+)
has a CPU backend, so ``--bnb DIR`` (a ``pip install --target DIR bitsandbytes``) puts it on
the child's path; without it, or where it cannot run, the row is reported as not measured.

    python bench/estimate_accuracy.py --only tf [--bnb /tmp/bnb]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fitbox.core import sizing  # noqa: E402
from fitbox.core.repack import CpuFeatures  # noqa: E402
from fitbox.engines.llama_server import find_binary, inspect  # noqa: E402
from fitbox.engines.measure import LoadSpec, measure_load  # noqa: E402
from fitbox.engines.tf import probe  # noqa: E402
from fitbox.models.gguf_facts import read_facts  # noqa: E402
from fitbox.models.pull import pull  # noqa: E402
from tests.support.gguf_zoo import WRITERS  # noqa: E402
from tests.support.quants import quantized_models  # noqa: E402

MIB = 1 << 20
KINDS = ("weights", "kv", "compute", "output", "total")
FULL_GRID = [
    LoadSpec(1024, 1),
    LoadSpec(4096, 1),
    LoadSpec(8192, 4),
    LoadSpec(4096, 4, unified=True),
    LoadSpec(2048, 1, type_k="q8_0", type_v="q8_0"),
    LoadSpec(4096, 2, type_k="q4_0", type_v="q4_0"),
    LoadSpec(2048, 1, type_k="bf16", type_v="f16"),
    LoadSpec(1024, 1, flash_attn=False),
    LoadSpec(4096, 2, flash_attn=False),
    LoadSpec(2048, 1, type_k="q8_0", flash_attn=False),
]
QUICK_GRID = [FULL_GRID[1], FULL_GRID[2], FULL_GRID[4], FULL_GRID[8]]


def within_target(kind: str, predicted: int, measured: int) -> bool:
    """The issue's targets: weights, KV and output within 1 MiB, compute within 2 %, total
    within 1 %."""
    diff = abs(predicted - measured)
    if kind == "compute":
        return diff <= 0.02 * measured
    if kind == "total":
        return diff <= 0.01 * measured
    return diff <= MIB


@dataclass(frozen=True)
class Row:
    model: str
    spec: str
    kind: str
    predicted: int
    measured: int

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured else 0.0

    @property
    def met(self) -> bool:
        return within_target(self.kind, self.predicted, self.measured)


def predict(path: Path, spec: LoadSpec, cpu: CpuFeatures | None) -> dict[str, int]:
    """fitbox's estimate for a load on host RAM with these settings."""
    shape = read_facts(path).shape
    window = sizing.effective_window(shape, spec.window)
    f = sizing.footprint(
        shape,
        window,
        spec.parallel,
        type_k=spec.type_k,
        type_v=spec.type_v,
        unified=spec.unified,
        cpu=cpu if spec.repack else None,
        flash_attn=spec.flash_attn,
    )
    return {
        "weights": f.weights,
        "kv": f.kv,
        "compute": f.compute,
        "output": f.output,
        "total": f.total,
    }


def compare(name: str, path: Path, spec: LoadSpec, binary: Path) -> list[Row]:
    predicted = predict(path, spec, inspect(binary).cpu)
    window = sizing.effective_window(read_facts(path).shape, spec.window)
    report = measure_load(binary, path, replace(spec, window=window))
    got = report.bytes_by_kind()
    if not got["model"]:
        raise RuntimeError(f"{name} {spec.label()} did not load: {report.errors}")
    measured = {
        "weights": got["model"],
        "kv": got["kv"] + got["recurrent"],
        "compute": got["compute"],
        "output": got["output"],
    }
    measured["total"] = sum(measured.values())
    return [Row(name, spec.label(), k, predicted[k], measured[k]) for k in KINDS]


def zoo_models(tmp: Path) -> dict[str, Path]:
    cache = Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models"
    found = {"smollm2": pull("smollm2", cache)}
    for name, writer in WRITERS.items():
        found[name] = writer(tmp / f"{name}.gguf")
    return found


def models(tmp: Path) -> dict[str, Path]:
    """Back-compatible name: the zoo (SmolLM2 and the tiny GGUFs)."""
    return zoo_models(tmp)


def applicable(path: Path, grid: list[LoadSpec]) -> list[LoadSpec]:
    """The settings the engine accepts for this model (a quantized cache needs its block to
    divide the head dim, a quantized V needs flash attention)."""
    shape = read_facts(path).shape
    return [s for s in grid if not sizing.kv_type_problem(shape, s.type_k, s.type_v, s.flash_attn)]


def jobs(
    tmp: Path, grid: list[LoadSpec], only: str, rotate: bool
) -> Iterator[tuple[str, Path, LoadSpec]]:
    """(model, file, settings) to load: the zoo over the grid; each quant over the grid, or
    (``rotate``) one setting per quant, taken round the grid so every setting is covered."""
    if only in ("", "zoo"):
        for name, path in zoo_models(tmp).items():
            for spec in applicable(path, grid):
                yield name, path, spec
    if only in ("", "quants"):
        cache = Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "quants"
        for i, (name, path) in enumerate(sorted(quantized_models(cache).items())):
            specs = applicable(path, grid)
            for spec in [specs[i % len(specs)]] if rotate else specs:
                yield name, path, spec


def run(grid: list[LoadSpec], only: str = "", rotate: bool = False) -> list[Row]:
    binary = find_binary().path
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, spec in jobs(Path(tmp), grid, only, rotate):
            rows.extend(compare(name, path, spec, binary))
    return rows


# Run in the engine's interpreter: the float32 folder cast to bfloat16.
TO_BF16 = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
model.save_pretrained(sys.argv[2])
AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])
"""


async def _counted(
    python: Path,
    folder: Path,
    embedding: bool,
    logs: Path,
    four_bit: bool = False,
    bnb: Path | None = None,
) -> int:
    from fitbox.engines.child import Child, free_port
    from fitbox.engines.seam import LaunchIntent
    from fitbox.engines.tf import Transformers

    engine = Transformers()
    engine._probe = probe(python)  # this interpreter, whatever the discovery order says
    intent = LaunchIntent(
        model_path=folder,
        alias=folder.name,
        window=512,
        parallel=1,
        gpu_layers=0,
        port=free_port(),
        embedding=embedding,
        load_in_4bit=four_bit,
    )
    spec = engine.launch(intent)
    env = dict(spec.env) | ({"PYTHONPATH": str(bnb)} if bnb is not None else {})
    child = Child(list(spec.argv), spec.port, logs / f"{folder.name}.log", env=env)
    await child.start()
    try:
        await child.wait_ready(600)
        held = await engine.held(child)
    finally:
        await child.stop(5)
    if held is None:
        raise RuntimeError(f"{folder}: the child reported no counted weights")
    return held.weights


def tf_rows(bnb: Path | None = None) -> list[Row]:
    import asyncio
    import subprocess

    from fitbox.models.hf_folders import folder_facts
    from tests.support.tf_engine import minilm_folder, smol_folder, tf_venv

    python = tf_venv()
    cache = Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache"))
    f32 = smol_folder(python, pull("smollm2", cache / "models"))
    bf16 = f32.with_name("SmolLM2-135M-Instruct-bf16")
    if not (bf16 / "model.safetensors").is_file():
        subprocess.run(
            [str(python), "-c", TO_BF16, str(f32), str(bf16)],
            check=True,
            capture_output=True,
            timeout=600,
        )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for folder, embedding in ((f32, False), (bf16, False), (minilm_folder(), True)):
            facts = folder_facts(folder)
            counted = asyncio.run(_counted(python, folder, embedding, Path(tmp)))
            rows.append(
                Row(
                    folder.name,
                    f"tf {facts.quant} ram-only",
                    "weights",
                    facts.shape.weights_bytes,
                    counted,
                )
            )
        if bnb is None:
            print("4-bit: not measured (the test venv has no bitsandbytes; pass --bnb DIR)")
        else:
            facts = folder_facts(f32)
            assert facts.four_bit_weights is not None
            try:
                counted = asyncio.run(_counted(python, f32, False, Path(tmp), True, bnb))
            except Exception as exc:  # bitsandbytes that cannot run here: say so, go on
                print(f"4-bit: not measured ({exc})")
            else:
                rows.append(
                    Row(
                        f32.name,
                        "tf 4bit (bnb nf4) ram",
                        "weights",
                        facts.four_bit_weights,
                        counted,
                    )
                )
    return rows


def worst(rows: list[Row]) -> dict[str, Row]:
    """The worst row per kind: by relative error for compute and total, by bytes otherwise
    (as the targets are written)."""
    out: dict[str, Row] = {}
    for kind in KINDS:
        of_kind = [r for r in rows if r.kind == kind and r.measured]
        if not of_kind:
            continue
        relative = kind in ("compute", "total")
        out[kind] = max(
            of_kind, key=lambda r: abs(r.error) if relative else abs(r.predicted - r.measured)
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="four settings per model")
    parser.add_argument("--only", choices=("zoo", "quants", "tf"), default="")
    parser.add_argument(
        "--bnb",
        type=Path,
        default=None,
        help="a folder holding bitsandbytes (pip install --target): 4-bit row",
    )
    args = parser.parse_args()
    rows = [] if args.only == "tf" else run(QUICK_GRID if args.quick else FULL_GRID, args.only)
    if args.only in ("", "tf"):
        rows += tf_rows(args.bnb)
    print(
        f"{'model':<14} {'settings':<30} {'kind':<8} {'predicted MiB':>13} "
        f"{'measured MiB':>13} {'error':>8}"
    )
    for r in rows:
        print(
            f"{r.model:<14} {r.spec:<30} {r.kind:<8} {r.predicted / MIB:13.2f} "
            f"{r.measured / MIB:13.2f} {r.error:+8.2%}{'' if r.met else '  MISS'}"
        )
    models_n, loads = len({r.model for r in rows}), len({(r.model, r.spec) for r in rows})
    print(f"\n{loads} loads of {models_n} models; worst row per kind:")
    for kind, r in worst(rows).items():
        misses = sum(1 for x in rows if x.kind == kind and not x.met)
        print(
            f"  {kind:<8} {r.model} {r.spec}: {r.error:+.2%} "
            f"({(r.predicted - r.measured) / MIB:+.3f} MiB)  "
            f"{'target met' if not misses else f'{misses} rows miss the target'}"
        )
    return 0 if all(r.met for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

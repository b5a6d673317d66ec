"""Estimate accuracy: fitbox's footprint from file headers against what llama-server really
allocated, per model, window, slots and K/V type, per buffer kind.

    python bench/estimate_accuracy.py [--quick]

Models: SmolLM2-135M (llama) and tiny GGUFs written with gguf that the engine loads: GQA
with per-layer KV heads (deci), sliding-window layers (gemma2), MoE (qwen2moe) and two
hybrids (LFM2, granite Mamba-2). Prints every row and the worst error per kind.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fitbox.core import sizing  # noqa: E402
from fitbox.engines.llama_server import find_binary  # noqa: E402
from fitbox.engines.measure import LoadSpec, measure_load  # noqa: E402
from fitbox.models.gguf_facts import read_facts  # noqa: E402
from fitbox.models.pull import pull  # noqa: E402
from tests.gguf_zoo import WRITERS  # noqa: E402

KINDS = ("weights", "kv", "compute", "output", "total")
FULL_GRID = [
    LoadSpec(1024, 1), LoadSpec(4096, 1), LoadSpec(8192, 4), LoadSpec(4096, 4, unified=True),
    LoadSpec(2048, 1, type_k="q8_0", type_v="q8_0"),
    LoadSpec(4096, 2, type_k="q4_0", type_v="q4_0"),
    LoadSpec(2048, 1, type_k="bf16", type_v="f16"),
]  # fmt: skip
QUICK_GRID = [FULL_GRID[1], FULL_GRID[2], FULL_GRID[4]]


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


def compare(name: str, path: Path, spec: LoadSpec, binary: Path) -> list[Row]:
    shape = read_facts(path).shape
    window = sizing.effective_window(shape, spec.window)
    kv = sizing.kv_bytes(shape, window, spec.parallel, type_k=spec.type_k, type_v=spec.type_v,
                         unified=spec.unified)  # fmt: skip
    predicted = {
        "weights": shape.weights_bytes,
        "kv": kv.total + sizing.recurrent_bytes(shape, spec.parallel),
        "compute": sizing.compute_bytes(shape, window, spec.parallel, spec.unified),
        "output": sizing.output_bytes(shape, spec.parallel),
    }
    predicted["total"] = sum(predicted.values())
    report = measure_load(binary, path, LoadSpec(window, spec.parallel, spec.unified,
                                                 spec.type_k, spec.type_v))  # fmt: skip
    got = report.bytes_by_kind()
    if not got["model"]:
        raise RuntimeError(f"{name} {spec.label()} did not load: {report.errors}")
    measured = {"weights": got["model"], "kv": got["kv"] + got["recurrent"],
                "compute": got["compute"], "output": got["output"]}  # fmt: skip
    measured["total"] = sum(measured.values())
    return [Row(name, spec.label(), k, predicted[k], measured[k]) for k in KINDS]


def models(tmp: Path) -> dict[str, Path]:
    cache = Path(os.environ.get("FITBOX_TEST_CACHE", REPO / ".cache")) / "models"
    found = {"smollm2": pull("smollm2", cache)}
    for name, writer in WRITERS.items():
        found[name] = writer(tmp / f"{name}.gguf")
    return found


def run(grid: list[LoadSpec]) -> list[Row]:
    binary = find_binary().path
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in models(Path(tmp)).items():
            shape = read_facts(path).shape
            for spec in grid:
                if sizing.kv_type_problem(shape, spec.type_k, spec.type_v, flash_attn=True):
                    continue
                rows.extend(compare(name, path, spec, binary))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three settings per model")
    args = parser.parse_args()
    rows = run(QUICK_GRID if args.quick else FULL_GRID)
    mib = 1024 * 1024
    print(f"{'model':<14} {'settings':<22} {'kind':<8} {'predicted MiB':>13} "
          f"{'measured MiB':>13} {'error':>8}")  # fmt: skip
    for r in rows:
        print(f"{r.model:<14} {r.spec:<22} {r.kind:<8} {r.predicted / mib:13.2f} "
              f"{r.measured / mib:13.2f} {r.error:+8.1%}")  # fmt: skip
    print("\nworst row per kind (by relative error; absolute error in MiB):")
    for kind in KINDS:
        of_kind = [r for r in rows if r.kind == kind and r.measured]
        worst = max(of_kind, key=lambda r: abs(r.error))
        print(
            f"  {kind:<8} {worst.model} {worst.spec}: {worst.error:+.1%} "
            f"({(worst.predicted - worst.measured) / mib:+.2f} MiB)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
